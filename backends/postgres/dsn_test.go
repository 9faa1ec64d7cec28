package postgres

import (
	"errors"
	"strings"
	"testing"
)

// TestDSNParseErrorHidesDSN: a DSN pgx cannot parse is reported by a fixed
// cause, never by pgx's message, which quotes the DSN and misses the
// password where spaces surround its '='. No database is needed: New
// fails before it connects.
func TestDSNParseErrorHidesDSN(t *testing.T) {
	const secret = "hunter2"
	tests := []struct {
		name string
		dsn  string
		want error
	}{
		{"spaces around = and a bad port", "host=db password = hunter2 port=abc", errDSNKeywords},
		{"quoted password, bad timeout", "host=db password = 'hunter2' connect_timeout=hunter2", errDSNKeywords},
		{"unterminated quote", "host=db password = 'hunter2", errDSNKeywords},
		{"bad sslmode", "host=db password=hunter2 sslmode=hunter2", errDSNKeywords},
		{"unreadable CA file", "host=db password = hunter2 sslmode=verify-full sslrootcert=/nonexistent/hunter2.pem", errDSNFile},
		{"URL, bad port", "postgres://lp:hunter2@db:hunter2/locks", errDSNURL},
		{"URL, bad escape", "postgresql://lp:hunter2%zz@db/locks", errDSNURL},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := New(Config{DSN: tt.dsn, TablePrefix: "lockproxy_"})
			if err == nil {
				b.Close()
				t.Fatalf("New(%q) = nil error; want a parse error", tt.dsn)
			}
			if msg := err.Error(); strings.Contains(msg, secret) || strings.Contains(msg, secret[:3]) || strings.Contains(msg, "password =") || strings.Contains(msg, "db") {
				t.Errorf("New(%q) = %q; shows the DSN", tt.dsn, msg)
			}
			if !strings.HasPrefix(err.Error(), "postgres.dsn: cannot be parsed: ") {
				t.Errorf("New(%q) = %q; want it to start with \"postgres.dsn: cannot be parsed: \"", tt.dsn, err)
			}
			if !errors.Is(err, tt.want) {
				t.Errorf("New(%q) = %q; want the cause %q", tt.dsn, err, tt.want)
			}
		})
	}
}
