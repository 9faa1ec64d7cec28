package commands

import (
	"strings"
	"testing"
)

// TestPasswordMatch: the digest comparison accepts exactly the password of
// a user that exists, whatever the lengths involved, and never the dummy
// that stands in for an unknown user's password.
func TestPasswordMatch(t *testing.T) {
	long := strings.Repeat("p", 1000)
	tests := []struct {
		name  string
		given string
		want  string
		known bool
		ok    bool
	}{
		{"right", "s3cret", "s3cret", true, true},
		{"wrong, same length", "s3creT", "s3cret", true, false},
		{"prefix", "s3c", "s3cret", true, false},
		{"longer", "s3cret!", "s3cret", true, false},
		{"empty given", "", "s3cret", true, false},
		{"long right", long, long, true, true},
		{"long, last byte differs", long[:999] + "q", long, true, false},
		{"binary", "\x00\xffpw", "\x00\xffpw", true, true},
		{"unknown user", "s3cret", "", false, false},
		{"unknown user, the dummy itself", unknownUser, "", false, false},
		{"unknown user, want ignored", "s3cret", "s3cret", false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := passwordMatch([]byte(tt.given), tt.want, tt.known); got != tt.ok {
				t.Errorf("passwordMatch(%q, %q, %v) = %v; want %v", tt.given, tt.want, tt.known, got, tt.ok)
			}
		})
	}
}

// TestPasswordOK: the handler looks the user up (default is auth.password,
// others auth.users) and compares through passwordMatch.
func TestPasswordOK(t *testing.T) {
	h := &Handler{password: "def-pw", users: map[string]string{"app": "app-pw"}}
	noDefault := &Handler{users: map[string]string{"app": "app-pw"}}
	tests := []struct {
		name       string
		h          *Handler
		user, pass string
		ok         bool
	}{
		{"default", h, "default", "def-pw", true},
		{"default, wrong", h, "default", "app-pw", false},
		{"named", h, "app", "app-pw", true},
		{"named, default's password", h, "app", "def-pw", false},
		{"unknown user", h, "nobody", "def-pw", false},
		{"default without auth.password", noDefault, "default", "", false},
		{"default without auth.password, dummy", noDefault, "default", unknownUser, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.h.passwordOK([]byte(tt.user), []byte(tt.pass)); got != tt.ok {
				t.Errorf("AUTH %q %q = %v; want %v", tt.user, tt.pass, got, tt.ok)
			}
		})
	}
}

// BenchmarkPasswordMatch shows that a wrong password costs the same
// whether its length matches, and an unknown user as much as a known one.
func BenchmarkPasswordMatch(b *testing.B) {
	for _, bc := range []struct {
		name  string
		given string
		known bool
	}{
		{"known, same length", "s3creT", true},
		{"known, other length", "x", true},
		{"unknown user", "s3creT", false},
	} {
		b.Run(bc.name, func(b *testing.B) {
			for b.Loop() {
				passwordMatch([]byte(bc.given), "s3cret", bc.known)
			}
		})
	}
}
