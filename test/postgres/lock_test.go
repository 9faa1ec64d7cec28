package postgres

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/test/harness"
	"github.com/lockproxy/lockproxy/test/lockclient"
)

// TestFencesAcrossInstances: 200 grants of one key, alternating between
// two lockproxies on one database, get strictly increasing fences (one
// sequence, taken in the transaction that inserts the hold).
func TestFencesAcrossInstances(t *testing.T) {
	prefix := newPrefix()
	a := startInstance(t, shared.DSN(), prefix)
	b := startInstance(t, shared.DSN(), prefix)
	clients := []any{lc.NewClient(t, a.addr, 2), lc.NewClient(t, b.addr, 3)}
	key := "fences-" + lockclient.RandID()
	var prev int64
	for i := range 200 {
		c := clients[i%2].(lockclient.Doer)
		g := lc.MustLock(t, c, key, "PX", 10000)
		if g.Fence <= prev {
			t.Fatalf("grant %d (instance %d): fence %d; want > %d", i, i%2, g.Fence, prev)
		}
		prev = g.Fence
		if n := lc.Unlock(t, c, key, g.Token); n != 1 {
			t.Fatalf("grant %d: UNLOCK = %d; want 1", i, n)
		}
	}
}

// TestWaitWokenAcrossInstances: a lock held through instance A blocks
// instance B; B's LOCK … WAIT is woken by the UNLOCK on A (a NOTIFY on
// the release channel) within a second, well before its wait runs out, and
// counted as a wake-up on B's /metrics.
// Then writer preference across instances: a writer waiting on B holds
// back new readers on A.
func TestWaitWokenAcrossInstances(t *testing.T) {
	prefix := newPrefix()
	a := startInstance(t, shared.DSN(), prefix)
	b := startInstance(t, shared.DSN(), prefix)
	ca, cb := lc.NewClient(t, a.addr, 3), lc.NewClient(t, b.addr, 3)
	key := "wake-" + lockclient.RandID()

	g := lc.MustLock(t, ca, key, "PX", 60000)
	if _, ok := lc.Lock(t, cb, key, "PX", 10000); ok {
		t.Fatal("B granted the lock A holds")
	}
	got := make(chan error, 1)
	go func() {
		_, ok, err := lockclient.TryLock(lockclient.CtxFor(t, 60*time.Second), cb, key, "PX", 10000, "WAIT", 30000)
		if err == nil && !ok {
			err = fmt.Errorf("LOCK … WAIT 30000 on B = nil")
		}
		got <- err
	}()
	// The waiter waits once its first try was refused: a waiting writer
	// marks the key (writer preference). A fixed while may not be enough
	// on a loaded machine, and an UNLOCK before that try leaves nothing
	// to wake.
	waitForRow(t, prefix+"waiting_writers", key)
	select {
	case err := <-got:
		t.Fatalf("B's waiter returned while A held the lock: %v", err)
	default:
	}
	const wakeups = "lockproxy_postgres_wakeups_total"
	before := metric(t, b, wakeups)
	unlocked := time.Now()
	if n := lc.Unlock(t, ca, key, g.Token); n != 1 {
		t.Fatalf("UNLOCK on A = %d", n)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	if d := time.Since(unlocked); d > time.Second {
		t.Errorf("B's waiter granted %v after the UNLOCK on A; want within a second", d)
	}
	// Woken by the NOTIFY, not by its next poll.
	if after := metric(t, b, wakeups); before < 0 || after <= before {
		t.Errorf("%s on B: %v before the UNLOCK on A, %v after; want it to grow", wakeups, before, after)
	}

	// Writer preference: r1 reads through A, a writer waits on B, a new
	// reader on A must wait behind that writer.
	rkey := "pref-" + lockclient.RandID()
	lc.MustRLock(t, ca, rkey, "PX", 60000, "TOKEN", "r1")
	wgot := make(chan error, 1)
	go func() {
		_, ok, err := lockclient.TryLock(lockclient.CtxFor(t, 60*time.Second), cb, rkey, "PX", 10000, "WAIT", 30000, "TOKEN", "w")
		if err == nil && !ok {
			err = fmt.Errorf("the writer's LOCK … WAIT = nil")
		}
		wgot <- err
	}()
	waitForRow(t, prefix+"waiting_writers", rkey)
	if _, ok := lc.RLock(t, ca, rkey, "PX", 10000, "TOKEN", "r2"); ok {
		t.Errorf("a new reader on A was granted while a writer waited on B; want it to wait (writer preference)")
	}
	lc.Unlock(t, ca, rkey, "r1")
	if err := <-wgot; err != nil {
		t.Fatal(err)
	}
	lc.Unlock(t, cb, rkey, "w")
	// The writer's marker went with its grant's transaction (it used to be
	// deleted after the reply, and this reader was refused now and then):
	// no wait for it to go is needed.
	lc.MustRLock(t, ca, rkey, "PX", 10000, "TOKEN", "r2")
}

// TestDatabaseKilled: with its PostgreSQL SIGKILLed, lockproxy answers
// LOCK with an error naming postgres (never a grant); after a restart on
// the same data directory a lock granted before the crash, still within
// its lease, is still held, with its fence.
func TestDatabaseKilled(t *testing.T) {
	// Parallel: it waits on the restart of a server, on a server of its own,
	// beside the package's other parallel tests (see Makefile: make test's
	// last slot).
	t.Parallel()
	pg := harness.StartPostgres(t)
	in := startInstance(t, pg.DSN(), "lockproxy_")
	c := lc.NewClient(t, in.addr, 3)
	key := "crash-" + lockclient.RandID()
	held := lc.MustLock(t, c, key, "PX", 120000)

	pg.Kill()
	start := time.Now()
	_, ok, err := lockclient.TryLock(lockclient.CtxFor(t, 60*time.Second), c, "other-"+key, "PX", 10000)
	switch {
	case ok:
		t.Fatal("LOCK granted with the database down")
	case err == nil:
		t.Fatal("LOCK = nil with the database down; want an error")
	case !strings.Contains(err.Error(), "postgres"):
		t.Errorf("LOCK with the database down = %v; want an error naming postgres", err)
	}
	t.Logf("LOCK with the database down: %v after %v", err, time.Since(start))

	if err := pg.Restart(); err != nil {
		t.Fatal(err)
	}
	// The pool reconnects by itself; the first statements may still fail.
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, ok, err := lockclient.TryLock(lockclient.CtxFor(t, 60*time.Second), c, key, "PX", 10000)
		if ok {
			t.Fatal("the lock granted before the crash was granted again after the restart")
		}
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("LOCK after the restart: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	v, err := c.Do(lockclient.CtxFor(t, 30*time.Second), "LOCKINFO", key, "TOKEN", held.Token).Result()
	if err != nil {
		t.Fatalf("LOCKINFO after the restart: %v", err)
	}
	if m, _ := v.(map[any]any); m == nil || m["fence"] != held.Fence {
		t.Errorf("LOCKINFO after the restart = %v; want fence %d", v, held.Fence)
	}
	if n := lc.Unlock(t, c, key, held.Token); n != 1 {
		t.Errorf("UNLOCK by the pre-crash holder = %d; want 1", n)
	}
}

// TestDatabaseHangs: with its PostgreSQL stopped (SIGSTOP, connections
// left open), LOCK, RENEW and LOCKINFO answer an error naming postgres
// within postgres.op_timeout instead of hanging; once it continues, the
// lock held before is still held and released normally. (UNLOCK times out
// the same way, but a timed-out UNLOCK, one statement, may still be applied
// when the database continues, so it is left out here; a LOCK's statements
// run in a transaction that the closed connection rolls back.)
func TestDatabaseHangs(t *testing.T) {
	// Parallel: it waits on operation timeouts, on a server of its own,
	// beside the package's other parallel tests (see Makefile: make test's
	// last slot).
	t.Parallel()
	pg := harness.StartPostgres(t)
	in := startInstance(t, pg.DSN(), "lockproxy_", "LOCKPROXY_POSTGRES_OP_TIMEOUT=1s")
	c := lc.NewClient(t, in.addr, 3)
	key := "hang-" + lockclient.RandID()
	held := lc.MustLock(t, c, key, "PX", 60000)

	pg.Pause()
	resumed := false
	defer func() {
		if !resumed {
			pg.Resume()
		}
	}()
	for _, args := range [][]any{
		{"LOCK", "other-" + key, "PX", 10000},
		{"RENEW", key, held.Token, "PX", 60000},
		{"LOCKINFO", key},
	} {
		start := time.Now()
		err := c.Do(lockclient.CtxFor(t, 60*time.Second), args...).Err()
		if err == nil || !strings.Contains(err.Error(), "postgres timeout") {
			t.Errorf("%v with the database stopped = %v after %v; want an error naming postgres timeout", args, err, time.Since(start))
		}
	}
	pg.Resume()
	resumed = true
	if _, ok := lc.Lock(t, c, key, "PX", 10000); ok {
		t.Error("the lock held before the pause was granted again")
	}
	if n := lc.Unlock(t, c, key, held.Token); n != 1 {
		t.Errorf("UNLOCK after the pause = %d; want 1", n)
	}
}

// TestExpiredRowsSwept: rows of leases that ran out are deleted by the
// sweep, so the table does not grow with every key ever locked.
func TestExpiredRowsSwept(t *testing.T) {
	// Parallel: it waits on leases and the sweep, on tables of its own,
	// beside the package's other parallel tests (see Makefile: make test's
	// last slot).
	t.Parallel()
	prefix := newPrefix()
	in := startInstance(t, shared.DSN(), prefix, "LOCKPROXY_POSTGRES_SWEEP_INTERVAL=300ms")
	c := lc.NewClient(t, in.addr, 3)
	const keys = 50
	for i := range keys {
		lc.MustLock(t, c, fmt.Sprintf("sweep-%d", i), "PX", 2000)
	}
	if n := countRows(t, shared, prefix, "holds"); n == 0 || n > keys {
		t.Fatalf("%d rows after %d grants; want 1..%d", n, keys, keys)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		n := countRows(t, shared, prefix, "holds")
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d rows left 30 s after every lease ran out; want the sweep to delete them", n)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestBadDSN: lockproxy refuses to start, saying why, when the DSN does
// not parse, names a server nobody runs or a database that does not exist,
// or logs in as a role that may not create the missing tables.
func TestBadDSN(t *testing.T) {
	bin := harness.BuildLockproxy(t)
	noRightsRole(t)
	for _, tc := range []struct {
		name, dsn, want string
	}{
		{"unparsable", "postgres://lp@127.0.0.1:notaport/db", "postgres.dsn: cannot be parsed"},
		{"nobody listens", "postgres://lp@" + harness.RefusedAddr(t) + "/db?connect_timeout=5", "connection refused"},
		{"no such database", strings.Replace(shared.DSN(), "/postgres?", "/nosuchdb?", 1), "database does not exist"},
		{"no rights", strings.Replace(shared.DSN(), "lockproxy@", "norights@", 1), "cannot create the lock tables"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(bin, "--listen", fmt.Sprintf("127.0.0.1:%d", harness.FreePort(t)), "--admin", "",
				"--backend", "postgres", "--postgres-dsn", tc.dsn)
			p := harness.StartCmd(t, cmd)
			code, err := p.Wait(60 * time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if code == 0 || !strings.Contains(p.Output(), tc.want) {
				t.Errorf("exit %d, output:\n%s\nwant a failure saying %q", code, p.Output(), tc.want)
			}
			t.Logf("exit %d: %s", code, p.Output())
		})
	}
}

// noRightsRole makes the role norights on the shared server (if missing):
// it may log in and create nothing in schema public.
func noRightsRole(t *testing.T) {
	t.Helper()
	conn := shared.Conn(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := conn.Exec(ctx, `DO $$ BEGIN CREATE ROLE norights LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$`); err != nil {
		t.Fatal(err)
	}
	// PostgreSQL 15 and later give PUBLIC no CREATE on schema public.
	if _, err := conn.Exec(ctx, `REVOKE CREATE ON SCHEMA public FROM PUBLIC`); err != nil {
		t.Fatal(err)
	}
}

// TestLeastRights: on tables an owner made, a role with no more than
// SELECT, INSERT, UPDATE, DELETE on the two tables and USAGE, UPDATE on the
// sequence runs every lock command, sharing the locks and fences of an
// instance that logs in as the owner.
func TestLeastRights(t *testing.T) {
	noRightsRole(t)
	prefix := newPrefix()
	owner := startInstance(t, shared.DSN(), prefix) // creates the tables
	conn := shared.Conn(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, q := range []string{
		"GRANT SELECT, INSERT, UPDATE, DELETE ON " + prefix + "holds, " + prefix + "waiting_writers TO norights",
		"GRANT USAGE, UPDATE ON SEQUENCE " + prefix + "fence TO norights",
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	least := startInstance(t, strings.Replace(shared.DSN(), "lockproxy@", "norights@", 1), prefix)
	co, cl := lc.NewClient(t, owner.addr, 3), lc.NewClient(t, least.addr, 3)
	key := "least-" + lockclient.RandID()
	g1 := lc.MustLock(t, co, key, "PX", 10000)
	if _, ok := lc.Lock(t, cl, key, "PX", 10000); ok {
		t.Fatal("the least-rights instance granted a lock the owner's instance holds")
	}
	lc.Unlock(t, co, key, g1.Token)
	g2 := lc.MustLock(t, cl, key, "PX", 10000, "TOKEN", "w")
	if g2.Fence <= g1.Fence {
		t.Errorf("fence %d after %d; want larger", g2.Fence, g1.Fence)
	}
	lc.MustLock(t, cl, key, "PX", 10000, "TOKEN", "w")
	lc.MustRLock(t, cl, key, "PX", 10000, "TOKEN", "w")
	if v := lc.IntCmd(t, cl, "RENEW", key, "w", "PX", 20000); v <= 0 {
		t.Errorf("RENEW = %d", v)
	}
	if in, err := cl.Do(lockclient.CtxFor(t, 30*time.Second), "LOCKINFO", key).Result(); err != nil {
		t.Errorf("LOCKINFO = %v, %v", in, err)
	}
	for i, want := range []int64{1, 1, 1, 0} {
		if n := lc.Unlock(t, cl, key, "w"); n != want {
			t.Errorf("UNLOCK %d = %d; want %d", i+1, n, want)
		}
	}
	// A waiting writer's row works under the same rights.
	lc.MustRLock(t, co, key, "PX", 10000, "TOKEN", "r")
	got := make(chan error, 1)
	go func() {
		_, ok, err := lockclient.TryLock(lockclient.CtxFor(t, 60*time.Second), cl, key, "PX", 10000, "WAIT", 30000)
		if err == nil && !ok {
			err = fmt.Errorf("LOCK … WAIT = nil")
		}
		got <- err
	}()
	waitForRow(t, prefix+"waiting_writers", key)
	lc.Unlock(t, co, key, "r")
	if err := <-got; err != nil {
		t.Fatal(err)
	}
}

// TestKeepaliveMaxHold: a KEEPALIVE lock outlives its lease while its
// client is connected and talks, and MAXHOLD ends it: a rival waiting on
// the other instance gets it after MAXHOLD, not before.
func TestKeepaliveMaxHold(t *testing.T) {
	prefix := newPrefix()
	a := startInstance(t, shared.DSN(), prefix)
	b := startInstance(t, shared.DSN(), prefix)
	ca, cb := lc.NewClient(t, a.addr, 3), lc.NewClient(t, b.addr, 3)
	key := "maxhold-" + lockclient.RandID()
	granted := time.Now()
	// A 1 s lease: a shorter one can be spent whole by one slow grant on
	// a loaded machine (answered nil), and the rival's first wait below
	// still ends past it and within MAXHOLD.
	lc.MustLock(t, ca, key, "PX", 1000, "KEEPALIVE", "MAXHOLD", 3000)
	// The holder's connection stays busy enough for the watchdog.
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
				_ = ca.Ping(lockclient.CtxFor(t, 10*time.Second)).Err()
			}
		}
	}()
	defer func() { close(stop); <-done }()
	if _, ok := lc.Lock(t, cb, key, "PX", 10000, "WAIT", 2000); ok {
		t.Fatalf("a rival was granted %v after the grant, within MAXHOLD, past the 1 s lease", time.Since(granted))
	}
	g, ok := lc.Lock(t, cb, key, "PX", 10000, "WAIT", 30000)
	if !ok {
		t.Fatal("the rival was not granted after MAXHOLD")
	}
	if d := time.Since(granted); d < 3*time.Second {
		t.Errorf("the rival was granted %v after the grant; want no sooner than MAXHOLD (3 s)", d)
	}
	lc.Unlock(t, cb, key, g.Token)
}

// TestSequenceCacheRefused: a fence sequence someone gave a cache (each
// connection would take values from a block of its own, so fences would
// not grow across connections) is refused at start, saying how to fix it.
func TestSequenceCacheRefused(t *testing.T) {
	prefix := newPrefix()
	startInstance(t, shared.DSN(), prefix).proc.Kill() // creates the tables
	conn := shared.Conn(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := conn.Exec(ctx, "ALTER SEQUENCE "+prefix+"fence CACHE 20"); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(harness.BuildLockproxy(t), "--listen", fmt.Sprintf("127.0.0.1:%d", harness.FreePort(t)), "--admin", "",
		"--backend", "postgres", "--postgres-dsn", shared.DSN())
	cmd.Env = append(cmd.Environ(), "LOCKPROXY_POSTGRES_TABLE_PREFIX="+prefix)
	p := harness.StartCmd(t, cmd)
	code, err := p.Wait(60 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if want := "CACHE 1"; code == 0 || !strings.Contains(p.Output(), want) {
		t.Errorf("exit %d, output:\n%s\nwant a refusal saying %q", code, p.Output(), want)
	}
}
