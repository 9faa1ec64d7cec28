package conf

import (
	"strings"
	"testing"
)

// TestSectionScalarNotEchoed: a scalar where a section that holds a
// secret goes is likely that secret ("auth: s3cret" for auth.password,
// "zookeeper: app:s3cret" for zookeeper.digest). The problem names the
// section and the scalar's kind, never its value, which check-config
// prints and lockproxy logs to the journal. Sections without secrets
// (limits) still quote it.
func TestSectionScalarNotEchoed(t *testing.T) {
	const secret = "s3cr3tpw"
	tests := []struct {
		name string
		yaml string
		want string // the problem must start with it
	}{
		{"auth password", "auth: " + secret + "\n", "auth: want a mapping, got !!str"},
		{"zookeeper digest", "zookeeper: app:" + secret + "\n", "zookeeper: want a mapping, got !!str"},
		{"redlock password", "redlock: " + secret + "\n", "redlock: want a mapping, got !!str"},
		{"postgres DSN", "postgres: host=db pass=" + secret + "\n", "postgres: want a mapping, got !!str"},
		{"a number", "auth: 987654321\n", "auth: want a mapping, got !!int"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := writeFile(t, "c.yaml", "dev: true\n"+tt.yaml)
			_, err := Parse([]string{p}, nil)
			if err == nil || !strings.HasPrefix(err.Error(), tt.want) {
				t.Fatalf("Parse(%q) = %v; want a problem starting %q", tt.yaml, err, tt.want)
			}
			if strings.Contains(err.Error(), secret) || strings.Contains(err.Error(), "987654321") {
				t.Errorf("Parse(%q) = %q; it shows the value", tt.yaml, err)
			}
		})
	}
	c := Default()
	err := decode([]byte("limits: 5\n"), "x.yaml", &c)
	if err == nil || !strings.Contains(err.Error(), `limits: want a mapping, got !!int "5"`) {
		t.Errorf("limits: 5 = %v; want the value quoted (limits holds no secret)", err)
	}
}
