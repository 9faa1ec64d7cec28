package commands

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/relay"
	"github.com/lockproxy/lockproxy/resp"
)

// metricValue reads the sample of name in reg whose labels include want
// (name=value pairs): a counter's or a gauge's value, a histogram's
// sample count; 0 when there is none.
func metricValue(t *testing.T, reg *prometheus.Registry, name string, want ...string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metrics:
		for _, m := range mf.GetMetric() {
			for i := 0; i+1 < len(want); i += 2 {
				found := false
				for _, l := range m.GetLabel() {
					found = found || l.GetName() == want[i] && l.GetValue() == want[i+1]
				}
				if !found {
					continue metrics
				}
			}
			switch {
			case m.Counter != nil:
				return m.GetCounter().GetValue()
			case m.Gauge != nil:
				return m.GetGauge().GetValue()
			case m.Histogram != nil:
				return float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return 0
}

// do sends one command on conn and returns its reply.
func do(t *testing.T, conn net.Conn, args ...string) []byte {
	t.Helper()
	var b [][]byte
	for _, a := range args {
		b = append(b, []byte(a))
	}
	if _, err := conn.Write(relay.AppendCommand(nil, b)); err != nil {
		t.Fatal(err)
	}
	return readFrames(t, conn, 1)[0]
}

// TestLocksHeldCountsHolds: a token's holds of a key are counted, by kind:
// after a reentrant LOCK or a downgrade's RLOCK with the same token, one
// UNLOCK leaves a hold, so the lock is still held: lockproxy_locks_held
// stays 1 and no holding time is observed until the last hold goes.
// Before, one entry per key and token was kept and the first UNLOCK
// removed it.
func TestLocksHeldCountsHolds(t *testing.T) {
	for _, tc := range []struct {
		name   string
		second string // the second acquisition, with the same token
		opts   []string
	}{
		{"reentrant LOCK", "LOCK", []string{"PX", "20000"}},
		{"downgrade to RLOCK", "RLOCK", []string{"PX", "20000"}},
		{"reentrant KEEPALIVE LOCK", "LOCK", []string{"KEEPALIVE", "PX", "20000"}},
		{"KEEPALIVE downgrade", "RLOCK", []string{"KEEPALIVE", "PX", "20000"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			conn := dialHandlerMetrics(t, &fakeBackend{}, reg)
			for _, cmd := range []string{"LOCK", tc.second} {
				if r := do(t, conn, append([]string{cmd, "k", "TOKEN", "t"}, tc.opts...)...); r[0] == '-' {
					t.Fatalf("%s = %q", cmd, r)
				}
			}
			if got := metricValue(t, reg, "lockproxy_locks_held"); got != 1 {
				t.Errorf("lockproxy_locks_held with two holds = %v; want 1 (one lock)", got)
			}
			if r := do(t, conn, "UNLOCK", "k", "t"); string(r) != ":1\r\n" {
				t.Fatalf("UNLOCK = %q", r)
			}
			if got := metricValue(t, reg, "lockproxy_locks_held"); got != 1 {
				t.Errorf("lockproxy_locks_held with one hold left = %v; want 1", got)
			}
			if got := metricValue(t, reg, "lockproxy_lock_held_duration_seconds"); got != 0 {
				t.Errorf("holding times observed with one hold left = %v; want 0", got)
			}
			if r := do(t, conn, "UNLOCK", "k", "t"); string(r) != ":1\r\n" {
				t.Fatalf("second UNLOCK = %q", r)
			}
			if got := metricValue(t, reg, "lockproxy_locks_held"); got != 0 {
				t.Errorf("lockproxy_locks_held after the last UNLOCK = %v; want 0", got)
			}
			if got := metricValue(t, reg, "lockproxy_lock_held_duration_seconds"); got != 1 {
				t.Errorf("holding times observed after the last UNLOCK = %v; want 1", got)
			}
		})
	}
}

// TestLocksHeldAfterClose: the KEEPALIVE holds a connection leaves on
// close are each released by its watchdog, and the lock then leaves
// lockproxy_locks_held: counting holds must not leave it counted.
func TestLocksHeldAfterClose(t *testing.T) {
	reg := prometheus.NewRegistry()
	b := &fakeBackend{}
	conn := dialHandlerMetrics(t, b, reg)
	for i := 0; i < 2; i++ {
		if r := do(t, conn, "LOCK", "k", "TOKEN", "t", "KEEPALIVE", "PX", "20000"); r[0] == '-' {
			t.Fatalf("LOCK = %q", r)
		}
	}
	if r := do(t, conn, "RLOCK", "k", "TOKEN", "t", "KEEPALIVE", "PX", "20000"); r[0] == '-' {
		t.Fatalf("RLOCK = %q", r)
	}
	_ = conn.Close()
	waitFor(t, func() bool { _, u := b.counts(); return u == 3 }, "the three holds released")
	waitFor(t, func() bool { return metricValue(t, reg, "lockproxy_locks_held") == 0 }, "lockproxy_locks_held back to 0")
	if got := metricValue(t, reg, "lockproxy_lock_held_duration_seconds"); got != 1 {
		t.Errorf("holding times observed = %v; want 1 (one lock)", got)
	}
}

// TestHeldLocksExpire: a lock whose lease ran out leaves the count however
// many holds it had (a lost KEEPALIVE lock is never released, and an
// UNLOCK may not come), so the gauge cannot drift upward; and a grant of
// another kind with a shorter TTL does not shorten the lease counted: a
// downgrade's write hold lasts as long as its read hold, and the other way
// round.
func TestHeldLocksExpire(t *testing.T) {
	reg := prometheus.NewRegistry()
	h := &heldLocks{m: map[heldKey]heldLock{}, met: newMetrics(reg)}
	h.granted("a", "t", backends.Write, time.Minute)
	h.granted("a", "t", backends.Write, time.Minute)
	h.granted("a", "t", backends.Read, time.Second)
	h.granted("b", "t", backends.Write, time.Second)
	h.renewed("b", "t", time.Second)
	if got := h.count(); got != 2 {
		t.Fatalf("count = %d; want 2", got)
	}
	h.expire(time.Now().Add(2 * time.Second))
	if got := h.count(); got != 1 {
		t.Errorf("count after b's lease ran out = %d; want 1 (a)", got)
	}
	if got := metricValue(t, reg, "lockproxy_lock_held_duration_seconds"); got != 1 {
		t.Errorf("holding times observed = %v; want 1 (b)", got)
	}
	h.expire(time.Now().Add(2 * time.Minute))
	if got, g := h.count(), metricValue(t, reg, "lockproxy_locks_held"); got != 0 || g != 0 {
		t.Errorf("count, gauge after a's lease (three holds) ran out = %d, %v; want 0", got, g)
	}
	// A release of a lock no longer counted changes nothing.
	h.released("a", "t")
	h.releasedHold("a", "t", backends.Read)
	if got := metricValue(t, reg, "lockproxy_lock_held_duration_seconds"); got != 2 {
		t.Errorf("holding times observed = %v; want 2", got)
	}
}

// serveHandler serves a Handler on backend b (its metrics in reg, when
// not nil) on a loopback port for the test's life, and returns it and a
// connection to it.
func serveHandler(t *testing.T, b backends.Backend, reg *prometheus.Registry) (*Handler, net.Conn) {
	t.Helper()
	o := Options{Limits: testLimits, Backend: b}
	if reg != nil {
		o.Registry = reg // a nil *Registry in the interface would not be nil
	}
	h := NewHandler(o)
	return h, dialTest(t, serveOn(t, &resp.Server{Handler: h}))
}

// serveOn serves srv on a loopback port for the test's life (then shuts
// it down and closes its Handler), and returns its address.
func serveOn(t *testing.T, srv *resp.Server) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		if h, ok := srv.Handler.(*Handler); ok {
			h.Close()
		}
	})
	return ln.Addr().String()
}

// dialTest connects to addr for the test's life.
func dialTest(t *testing.T, addr string) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// TestAcquireTotalOfRefusedGrants: every LOCK answered is in
// lockproxy_lock_acquire_total under the result its client saw, as it is
// in the duration histogram. A grant that landed after its client left,
// and a KEEPALIVE grant refused because the handler is closing, were
// both released and answered with an error: they are errors, not
// acquisitions (the closing one was counted acquired; the orphan in no
// result), and neither is left counted as held.
func TestAcquireTotalOfRefusedGrants(t *testing.T) {
	t.Run("orphan", func(t *testing.T) {
		reg := prometheus.NewRegistry()
		b := &orphanBackend{}
		conn := dialHandlerMetrics(t, b, reg)
		if _, err := conn.Write(relay.AppendCommand(nil, [][]byte{
			[]byte("LOCK"), []byte("k"), []byte("PX"), []byte("10000"), []byte("WAIT"), []byte("5000"),
		})); err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond) // the LOCK waits in the backend
		_ = conn.Close()
		waitFor(t, func() bool { return metricValue(t, reg, "lockproxy_lock_acquire_duration_seconds") == 1 },
			"the orphaned grant's duration observed")
		waitFor(t, func() bool { _, u := b.counts(); return u == 1 }, "the orphaned grant released")
		checkAcquireResults(t, reg, 0, 1)
	})
	t.Run("closing", func(t *testing.T) {
		reg := prometheus.NewRegistry()
		h, conn := serveHandler(t, &fakeBackend{}, reg)
		h.Close()
		if r := do(t, conn, "LOCK", "k", "PX", "10000", "KEEPALIVE"); r[0] != '-' {
			t.Fatalf("KEEPALIVE LOCK while the handler closes = %q; want an error", r)
		}
		checkAcquireResults(t, reg, 0, 1)
	})
}

// checkAcquireResults checks lockproxy_lock_acquire_total's acquired and
// error counts, that they account for every duration observed, and that
// no lock is left counted as held.
func checkAcquireResults(t *testing.T, reg *prometheus.Registry, acquired, errs float64) {
	t.Helper()
	got := map[string]float64{}
	var sum float64
	for _, r := range []string{"acquired", "not_acquired", "no_quorum", "error"} {
		got[r] = metricValue(t, reg, "lockproxy_lock_acquire_total", "result", r)
		sum += got[r]
	}
	if got["acquired"] != acquired || got["error"] != errs {
		t.Errorf("lockproxy_lock_acquire_total = %v; want acquired %v, error %v", got, acquired, errs)
	}
	if d := metricValue(t, reg, "lockproxy_lock_acquire_duration_seconds"); d != sum {
		t.Errorf("%v acquire durations observed, %v results counted; want as many", d, sum)
	}
	if n := metricValue(t, reg, "lockproxy_locks_held"); n != 0 {
		t.Errorf("lockproxy_locks_held = %v; want 0", n)
	}
}
