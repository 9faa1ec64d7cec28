package conf

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestPostgresDSNParsed: a postgres.dsn that the PostgreSQL backend cannot
// parse stops lockproxy at start, so Validate (and with it check-config)
// names it under postgres.dsn, without quoting any of it: the DSN may
// hold the password. A DSN that parses passes, and another backend's
// config does not parse an unused one.
func TestPostgresDSNParsed(t *testing.T) {
	const secret = "S3CRETPW"
	tests := []struct {
		name    string
		backend string
		dsn     string
		bad     bool
	}{
		{"URL", BackendPostgres, "postgres://lp:" + secret + "@db:5432/locks", false},
		{"keywords", BackendPostgres, "host=db dbname=locks password=" + secret, false},
		{"URL with a bad escape", BackendPostgres, "postgres://lp:" + secret + "%zz@db:5432/locks", true},
		{"URL with a bad sslmode", BackendPostgres, "postgres://lp:" + secret + "@db/locks?sslmode=bogus", true},
		{"keywords with a bad sslmode", BackendPostgres, "host=db password=" + secret + " sslmode=bogus", true},
		{"keywords with an unclosed quote", BackendPostgres, "host=db password='" + secret, true},
		{"missing sslrootcert", BackendPostgres, "host=db password=" + secret + " sslmode=verify-full sslrootcert=" + filepath.Join(t.TempDir(), "nope.pem"), true},
		{"unused by redlock", BackendRedlock, "host=db sslmode=bogus", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Default()
			c.Dev = true
			c.Backend = tt.backend
			c.Postgres.DSN = tt.dsn
			got := problems(t, c.Validate())
			has := slices.ContainsFunc(got, func(p string) bool { return strings.HasPrefix(p, "postgres.dsn: ") })
			if has != tt.bad || len(got) > 1 {
				t.Errorf("Validate(dsn %q) = %q; want a postgres.dsn problem: %v (and nothing else)", tt.dsn, got, tt.bad)
			}
			for _, p := range got {
				if strings.Contains(p, secret) || strings.Contains(p, "db") {
					t.Errorf("problem %q quotes the DSN", p)
				}
			}
		})
	}
	// Through the environment, as check-config reads it (HOME points
	// nowhere, so that no service or password file of the user's is read).
	t.Setenv("HOME", t.TempDir())
	p := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(p, []byte("backend: postgres\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := Parse([]string{p}, []string{"LOCKPROXY_POSTGRES_DSN=postgres://lp:" + secret + "%zz@db/locks"})
	if err == nil || !strings.Contains(err.Error(), "postgres.dsn: ") || strings.Contains(err.Error(), secret) {
		t.Errorf("Parse with a bad LOCKPROXY_POSTGRES_DSN = %v; want postgres.dsn named, the DSN not shown", err)
	}
}
