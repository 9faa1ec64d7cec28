package conf

import (
	"strings"
	"testing"
)

// TestUnknownEnvVariable: a LOCKPROXY_* variable that names no key (a
// typo) is warned about, with the closest known variable: silently
// dropped, a misspelt client CA or password leaves the listener without
// mutual TLS or authentication. It is a warning, not an error, because
// the tests' own LOCKPROXY_* variables share the environment.
func TestUnknownEnvVariable(t *testing.T) {
	for _, tt := range []struct {
		name, env, key, closest string
	}{
		{"client CA file", "LOCKPROXY_TLS_CLIENTCA_FILE=/etc/lockproxy/clients.pem", "LOCKPROXY_TLS_CLIENTCA_FILE", "LOCKPROXY_TLS_CLIENT_CA_FILE"},
		{"password", "LOCKPROXY_AUTH_PASWORD=s3cret", "LOCKPROXY_AUTH_PASWORD", "LOCKPROXY_AUTH_PASSWORD"},
		{"node CA file", "LOCKPROXY_REDLOCK_TLS_CAFILE=/etc/lockproxy/redis-ca.pem", "LOCKPROXY_REDLOCK_TLS_CAFILE", "LOCKPROXY_REDLOCK_TLS_CA_FILE"},
		{"nothing close", "LOCKPROXY_FROBNICATE_EVERYTHING=1", "LOCKPROXY_FROBNICATE_EVERYTHING", ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c, err := FromArgs([]string{"--dev"}, []string{tt.env})
			if err == nil {
				err = c.Validate()
			}
			if err != nil {
				t.Fatalf("FromArgs with %s: %v; want a warning only", tt.env, err)
			}
			var found string
			for _, w := range c.Warnings() {
				if strings.Contains(w, tt.key) {
					found = w
				}
			}
			switch {
			case found == "":
				t.Errorf("FromArgs with %s: warnings %q; want %s named as unknown", tt.env, c.Warnings(), tt.key)
			case tt.closest != "" && !strings.Contains(found, tt.closest):
				t.Errorf("warning %q; want it to name %s", found, tt.closest)
			case tt.closest == "" && strings.Contains(found, "did you mean"):
				t.Errorf("warning %q suggests a variable; want none", found)
			case strings.Contains(found, "s3cret"):
				t.Errorf("warning %q shows the variable's value", found)
			}
		})
	}
}

// TestKnownNonKeyEnvVariables: the variables that are not keys but are
// read (LOCKPROXY_CONFIG, LOCKPROXY_UPSTREAM) or belong to the tests and
// the Makefile (LOCKPROXY_SOAK, LOCKPROXY_TEST_*, LOCKPROXY_PG_HOTKEY)
// give no warning: the e2e tests run lockproxy with the test run's
// environment.
func TestKnownNonKeyEnvVariables(t *testing.T) {
	env := []string{
		"LOCKPROXY_UPSTREAM=127.0.0.1:6379", "LOCKPROXY_SOAK=1", "LOCKPROXY_TEST_BUILDFLAGS=-race",
		"LOCKPROXY_PG_HOTKEY=1", "LOCKPROXY_REDLOCK_DRIFT_FACTOR=0.02",
	}
	c, err := FromArgs([]string{"--dev"}, env)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range c.Warnings() {
		if strings.Contains(w, "LOCKPROXY_") {
			t.Errorf("warning %q; want none for %q", w, env)
		}
	}
}
