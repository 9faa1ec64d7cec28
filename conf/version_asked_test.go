package conf

import "testing"

// TestVersionAsked: --version, -version and -v ask for the version as
// flags, wherever they are among the others, but not as another flag's
// value: before, any argument spelt so did ("--listen -v" printed
// the version instead of starting).
func TestVersionAsked(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want bool
	}{
		{[]string{"--version"}, true},
		{[]string{"-version"}, true},
		{[]string{"-v"}, true},
		{[]string{"--dev", "--version"}, true},
		{[]string{"lockproxy.yaml", "-v"}, true},
		{[]string{"check-config", "lockproxy.yaml", "--version"}, true},
		{[]string{"--version=true"}, true},
		{[]string{"--version=false"}, false},
		{[]string{}, false},
		{[]string{"--dev"}, false},
		{[]string{"--key-prefix", "-v"}, false},
		{[]string{"--upstream", "-version"}, false},
		{[]string{"--listen", "--version"}, false},
		{[]string{"-c", "-v"}, false},
		{[]string{"--", "-v"}, false},
	} {
		if got := VersionAsked(tc.args); got != tc.want {
			t.Errorf("VersionAsked(%q) = %v; want %v", tc.args, got, tc.want)
		}
	}
}
