package fault

import (
	"context"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/test/harness"
	"github.com/lockproxy/lockproxy/test/lockclient"
)

// TestRenewedLongHold runs long holds (longhold_test.go) that the rows'
// long holds do not: a holder that RENEWs and then keeps the lock for
// longHoldShare of the validity the RENEW reported (counted from when the
// RENEW was sent), and a reader (RLOCK) that keeps its read lock for
// longHoldShare of its validity; each time a client of the other instance
// waits for the key with LOCK. The rows' long holds are exclusive and
// never RENEW, the renew row's holder lets go right after its renewals,
// and the workload takes no read locks, so without this nothing checks
// that the lease a RENEW or an RLOCK reports is kept on a majority of
// nodes: a lease shorter on the nodes than reported lets the writer in
// while the holder still holds.
func TestRenewedLongHold(t *testing.T) {
	// Its own nodes and instances: it runs beside the other single-purpose
	// tests once the rows are done (most of its time is spent waiting).
	t.Parallel()
	harness.RequireBinary(t, "redis-server", "redis-server")
	e := newEnv(t, 5, 2)
	for _, tc := range []struct {
		name    string
		cmd     string // LOCK or RLOCK
		renewMS int64  // RENEW PX this after 300 ms; 0: no RENEW
	}{
		{"LOCK, RENEW PX ttl", "LOCK", ttlMS},
		{"LOCK, RENEW PX 1.5 ttl", "LOCK", ttlMS * 3 / 2},
		{"RLOCK", "RLOCK", 0},
		{"RLOCK, RENEW PX ttl", "RLOCK", ttlMS},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := "renewed-hold-" + lockclient.RandID()
			holder := newClient(e.proxies[0].addr)
			defer func() { _ = holder.Close() }()
			sent := e.hist.Now()
			r, ok, err := lockclient.TryAcquire(lockclient.CtxFor(t, 10*time.Second), holder, tc.cmd, key, "PX", ttlMS)
			enter := e.hist.Now()
			if err != nil || !ok {
				t.Fatalf("%s %s = %v, %v; want a grant", tc.cmd, key, ok, err)
			}
			hg := Grant{Key: key, Token: r.Token, Fence: r.Fence, Client: "p0.renewed-holder",
				Enter: enter, Deadline: enter + time.Duration(r.ValidityMS)*time.Millisecond,
				TTL: ttlMS * time.Millisecond, Validity: time.Duration(r.ValidityMS) * time.Millisecond}
			hg.Read = e.ledger.Read(key, hg.Fence)

			// The writer waiting, through the other instance.
			got := make(chan Grant, 1)
			go func() {
				cl := newClient(e.proxies[1].addr)
				defer func() { _ = cl.Close() }()
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer cancel()
				wr, ok, err := lockclient.TryLock(ctx, cl, key, "PX", ttlMS, "WAIT", 4*ttlMS)
				g := Grant{Key: key, Client: "p1.renewed-waiter", Enter: e.hist.Now()}
				if err != nil || !ok {
					g.Client = ""
					got <- g
					return
				}
				g.Token, g.Fence = wr.Token, wr.Fence
				g.Deadline = g.Enter + time.Duration(wr.ValidityMS)*time.Millisecond
				g.TTL, g.Validity = ttlMS*time.Millisecond, time.Duration(wr.ValidityMS)*time.Millisecond
				e.critical(key, &g)
				g.Exit = e.hist.Now()
				_ = cl.Do(ctx, "UNLOCK", key, wr.Token).Err()
				got <- g
			}()

			validity := time.Duration(r.ValidityMS) * time.Millisecond
			if tc.renewMS > 0 {
				time.Sleep(300 * time.Millisecond)
				sent = e.hist.Now()
				v, err := holder.Do(lockclient.CtxFor(t, 5*time.Second), "RENEW", key, r.Token, "PX", tc.renewMS).Int64()
				if err != nil || v <= 0 {
					t.Fatalf("RENEW %s PX %d = %d, %v; want a validity", key, tc.renewMS, v, err)
				}
				// The promise counts from before the RENEW was sent.
				validity = time.Duration(v) * time.Millisecond
				hg.Deadline = sent + validity
			}
			if d := sent + time.Duration(float64(validity)*longHoldShare) - e.hist.Now(); d > 0 {
				time.Sleep(d)
			}
			hg.Use = e.hist.Now()
			hg.Rejected = !e.ledger.Write(key, hg.Fence, hg.Read+1)
			hg.Exit = e.hist.Now()
			e.hist.Add(hg)
			_ = holder.Do(lockclient.CtxFor(t, 5*time.Second), "UNLOCK", key, r.Token).Err()

			wg := <-got
			if wg.Client == "" {
				t.Fatalf("the writer on p1 got no grant once the holder let go")
			}
			e.hist.Add(wg)
			rep := Check([]Grant{hg, wg})
			t.Logf("%s: validity %v; held %v; the writer entered %v after the holder's exit",
				tc.name, validity, (hg.Exit - hg.Enter).Round(time.Millisecond), (wg.Enter - hg.Exit).Round(time.Millisecond))
			if rep.Violations() > 0 {
				t.Errorf("%s held to %.0f %% of its validity: %v", tc.name, 100*longHoldShare, rep)
			}
		})
	}
}
