package postgres

import (
	"context"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/test/lockclient"
)

// TestKeepaliveSlowGrantToldBeforeRival: a KEEPALIVE lock whose grant's
// COMMIT was slow (a deferred trigger sleeps 2.2 s at commit, as a stalled
// fsync or a synchronous standby would) is granted with a short validity
// (about 0.77 s of PX 3000): the row's lease began at the INSERT, 2.2 s
// before the reply. The holder relies on the lock until it is told it is
// lost, so the watchdog must renew it (or report it lost) before that
// lease ends: a rival waiting on the other instance is either never
// granted while the holder talks, or granted only after the holder's
// lock-lost push. Before, the watchdog renewed first TTL/3 (1 s) after the
// reply, the lease had ended, and the rival held the key for about 0.2 s
// before the holder was told.
func TestKeepaliveSlowGrantToldBeforeRival(t *testing.T) {
	prefix := newPrefix()
	a := startInstance(t, shared.DSN(), prefix)
	b := startInstance(t, shared.DSN(), prefix)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn := shared.Conn(t)
	for _, q := range []string{
		`CREATE FUNCTION ` + prefix + `slow() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(2.2); RETURN NULL; END $$`,
		`CREATE CONSTRAINT TRIGGER slow AFTER INSERT ON ` + prefix + `holds DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
			WHEN (NEW.token = 'slow-holder') EXECUTE FUNCTION ` + prefix + `slow()`,
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	key := "ka-slow-" + lockclient.RandID()
	holder := lc.DialRaw(t, a.addr)
	if r := holder.Do("HELLO", "3"); r.Kind == '-' {
		t.Fatalf("HELLO 3: %v", r)
	}
	sent := time.Now()
	r := holder.Do("LOCK", key, "PX", "3000", "TOKEN", "slow-holder", "KEEPALIVE")
	told := time.Now()
	if r.Kind != '%' {
		t.Fatalf("LOCK … KEEPALIVE = %v", r)
	}
	t.Logf("holder granted after %v, validity_ms %d", told.Sub(sent).Round(time.Millisecond), r.Pairs()["validity_ms"].Int)

	rival := make(chan time.Time, 1)
	cb := lc.NewClient(t, b.addr, 3)
	go func() {
		_, ok, err := lockclient.TryLock(lockclient.CtxFor(t, 20*time.Second), cb, key, "PX", 10000, "WAIT", 4000)
		if err == nil && ok {
			rival <- time.Now()
			return
		}
		close(rival)
	}()

	// The holder's connection, kept alive for the watchdog: the lock-lost
	// push, if any, for longer than the rival waits.
	var lostAt time.Time
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); {
		p, err := holder.ReadWithin(200 * time.Millisecond)
		if err != nil {
			holder.Send("PING") // its +PONG is read next round
			continue
		}
		if p.Kind == '>' && len(p.Elems) > 0 && p.Elems[0].Str == "lock-lost" {
			lostAt = time.Now()
			break
		}
	}
	rt, granted := <-rival
	switch {
	case !granted:
		t.Logf("the lock was kept (lost push: %v); the rival was never granted", !lostAt.IsZero())
	case lostAt.IsZero():
		t.Errorf("the rival was granted %v after the holder's grant reply; the holder was never told its KEEPALIVE lock was lost",
			rt.Sub(told).Round(time.Millisecond))
	case lostAt.After(rt):
		t.Errorf("the rival on B was granted %v after the holder's reply, the holder's lock-lost push came %v after it: %v of overlap",
			rt.Sub(told).Round(time.Millisecond), lostAt.Sub(told).Round(time.Millisecond), lostAt.Sub(rt).Round(time.Millisecond))
	}
}
