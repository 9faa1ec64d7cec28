package postgres

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/test/harness"
	"github.com/lockproxy/lockproxy/test/lockclient"
)

// TestKeepaliveLostBeforeRivalUnderFaults is the fault matrix's rows 6 and
// 22 ("proxy cut off", "client told lost before a rival can be granted") on
// the PostgreSQL backend: a RESP3 client holds a KEEPALIVE lock (PX 1000)
// through instance A while a client of instance B waits for it; then
//   - A's link to the database drops every byte (B's is untouched): the
//     lease runs out on the database's clock and B may grant it, so A's
//     watchdog must have told its holder by then;
//   - the database is stopped (SIGSTOP) for 3 s, past the lease: when it
//     continues, B's waiting grant and A's renewal race, so A's holder
//     must have been told while the database was stopped.
//
// The holder keeps its connection busy (PING every 200 ms), so only the
// fault can end its lock. The fault must take effect: in the cut-off case
// the rival must be granted while A is still cut off (the lease really ran
// out), otherwise the row proves nothing and fails.
func TestKeepaliveLostBeforeRivalUnderFaults(t *testing.T) {
	tests := []struct {
		name string
		// inject starts the fault and returns a function that heals it.
		inject func(t *testing.T, pg *harness.Postgres, link *harness.Link) func()
		// healAfter: the fault is healed this long after it began (0:
		// once the rival is granted or gave up).
		healAfter time.Duration
		// rivalDuring: the rival must be granted while the fault is on.
		rivalDuring bool
		// soakOnly: run by `make soak` (LOCKPROXY_SOAK=1) only, to keep
		// `make test` within its time; TestDatabaseHangs stops the
		// database in every run.
		soakOnly bool
	}{
		{
			name: "instance-cut-off-from-database",
			inject: func(t *testing.T, _ *harness.Postgres, link *harness.Link) func() {
				link.Cut()
				return link.Heal
			},
			rivalDuring: true,
		},
		{
			name: "database-stopped-past-lease",
			inject: func(t *testing.T, pg *harness.Postgres, _ *harness.Link) func() {
				pg.Pause()
				return pg.Resume
			},
			healAfter: 3 * time.Second,
			soakOnly:  true,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.soakOnly && os.Getenv("LOCKPROXY_SOAK") != "1" {
				t.Skip("soak only (LOCKPROXY_SOAK=1, make soak)")
			}
			pg := harness.StartPostgres(t)
			link := harness.StartLink(t, pg.Addr)
			prefix := newPrefix()
			a := startInstance(t, strings.Replace(pg.DSN(), pg.Addr, link.Addr(), 1), prefix)
			b := startInstance(t, pg.DSN(), prefix)
			key := "ka-fault-" + lockclient.RandID()

			holder := lc.DialRaw(t, a.addr)
			if r := holder.Do("HELLO", "3"); r.Kind != '%' {
				t.Fatalf("HELLO 3 = %v", r)
			}
			r := holder.Do("LOCK", key, "PX", "1000", "KEEPALIVE")
			tok := r.Pairs()["token"].Str
			if r.Kind != '%' || tok == "" {
				t.Fatalf("LOCK … KEEPALIVE = %v", r)
			}
			rival := make(chan time.Time, 1)
			cb := lc.NewClient(t, b.addr, 2)
			go func() {
				defer close(rival)
				if _, ok, err := lockclient.TryLock(lockclient.CtxFor(t, 30*time.Second), cb, key, "PX", 5000, "WAIT", 15000); ok && err == nil {
					rival <- time.Now()
				}
			}()
			// The holder talks: its lock lives on while the fault is off.
			for end := time.Now().Add(1500 * time.Millisecond); time.Now().Before(end); {
				if p, err := holder.ReadWithin(200 * time.Millisecond); err != nil {
					holder.Send("PING")
				} else if p.Kind == '>' {
					t.Fatalf("push before the fault: %v", p)
				}
			}

			start := time.Now()
			heal := tc.inject(t, pg, link)
			healed := false
			var healedAt time.Time
			defer func() {
				if !healed {
					heal()
				}
			}()
			var lostAt time.Time
			for end := time.Now().Add(8 * time.Second); time.Now().Before(end) && lostAt.IsZero(); {
				if !healed && tc.healAfter > 0 && time.Since(start) >= tc.healAfter {
					heal()
					healed, healedAt = true, time.Now()
				}
				p, err := holder.ReadWithin(200 * time.Millisecond)
				if err != nil {
					holder.Send("PING")
					continue
				}
				if p.Kind == '>' && len(p.Elems) > 0 && p.Elems[0].Str == "lock-lost" {
					lostAt = time.Now()
				}
			}
			if !healed && tc.healAfter > 0 {
				time.Sleep(time.Until(start.Add(tc.healAfter)))
				heal()
				healed, healedAt = true, time.Now()
			}
			var rt time.Time
			var granted bool
			select {
			case rt, granted = <-rival:
			case <-time.After(20 * time.Second):
			}
			if !healed {
				heal()
				healed, healedAt = true, time.Now()
			}
			t.Logf("fault at 0 (healed at %v): lock-lost push at %v, rival on B granted at %v (granted %v)",
				healedAt.Sub(start).Round(time.Millisecond), since(start, lostAt), since(start, rt), granted)
			switch {
			case !granted:
				t.Errorf("the rival on B was never granted: the fault did not end the lease; the row proves nothing")
			case tc.rivalDuring && rt.After(healedAt):
				t.Errorf("the rival was granted only after the heal: the fault did not take effect")
			case lostAt.IsZero():
				t.Errorf("the rival on B was granted %v after the fault began; the KEEPALIVE holder on A was never told its lock was lost",
					rt.Sub(start).Round(time.Millisecond))
			case lostAt.After(rt):
				t.Errorf("the rival on B was granted %v after the fault began, the holder's lock-lost push came %v after it: %v of two holders",
					rt.Sub(start).Round(time.Millisecond), lostAt.Sub(start).Round(time.Millisecond), lostAt.Sub(rt).Round(time.Millisecond))
			}
		})
	}
}

func since(start, t time.Time) any {
	if t.IsZero() {
		return "never"
	}
	return t.Sub(start).Round(time.Millisecond)
}
