package postgres

import (
	"strings"
	"testing"
	"time"
)

// TestFenceStoreThatForgetsRefused: a fence sequence or holds table made
// beforehand (CREATE … IF NOT EXISTS keeps it as it is) that would let a
// later grant get a smaller fence, or lose granted locks, is refused at
// start, as a CACHE or CYCLE sequence is, naming the statement that fixes
// it. A descending sequence hands every grant a smaller fence than the
// last; crash recovery resets an UNLOGGED sequence to its start and
// empties an UNLOGGED table (seen: a lock granted for 10 minutes granted
// again to another token after a SIGKILL and restart, with fence 1 after
// fence 5). A sequence AS integer or with a low MAXVALUE runs out, and
// every LOCK fails from then on. Before, New accepted them all.
func TestFenceStoreThatForgetsRefused(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(p string) []string
		want  string
	}{
		{"descending sequence", func(p string) []string {
			return []string{`ALTER SEQUENCE ` + p + `fence INCREMENT BY -1 MINVALUE -1000 START WITH 1000 RESTART`}
		}, "INCREMENT BY 1"},
		{"integer sequence", func(p string) []string {
			return []string{`ALTER SEQUENCE ` + p + `fence AS integer`}
		}, "AS bigint"},
		{"low maximum", func(p string) []string {
			return []string{`ALTER SEQUENCE ` + p + `fence MAXVALUE 1000000`}
		}, "AS bigint"},
		{"unlogged sequence", func(p string) []string {
			return []string{`ALTER SEQUENCE ` + p + `fence SET UNLOGGED`}
		}, "SET LOGGED"},
		{"unlogged holds table", func(p string) []string {
			return []string{`ALTER TABLE ` + p + `holds SET UNLOGGED`}
		}, "SET LOGGED"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pg, p := testDB(t)
			newTestBackend(t, pg, p, 1).Close() // creates the tables
			execAll(t, pg, tc.setup(p)...)
			b, err := New(Config{DSN: pg.DSN(), TablePrefix: p, SweepInterval: time.Hour})
			if err == nil {
				b.Close()
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("New = %v; want a refusal naming %q", err, tc.want)
			}
		})
	}
}
