package e2e

import (
	"fmt"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/test/lockclient"
)

func TestAdminEndpoints(t *testing.T) {
	t.Parallel()
	eachSize(t, func(t *testing.T, n int) {
		cl := startCluster(t, n)
		in := startInstance(t, cl.addrs())
		c := lc.NewClient(t, in.addr, 2)
		base := "http://" + in.admin

		for _, path := range []string{"/healthz", "/readyz"} {
			if code, body := httpGet(t, base+path); code != 200 {
				t.Errorf("GET %s with all nodes up = %d %q; want 200", path, code, body)
			}
		}

		// Locks whose key and token must not show up in the metrics.
		key := "secret-key-" + lockclient.RandID()
		tok := "secret-token-" + lockclient.RandID()
		lc.MustLock(t, c, key, "PX", 10000, "TOKEN", tok)
		g := lc.MustLock(t, c, key+"-gen", "PX", 10000)
		lc.Lock(t, c, key, "PX", 10000) // not acquired
		if got := lc.Unlock(t, c, key, "wrong-"+lockclient.RandID()); got != 0 {
			t.Errorf("UNLOCK with a wrong token = %d; want 0", got)
		}

		code, body := httpGet(t, base+"/metrics")
		if code != 200 {
			t.Fatalf("GET /metrics = %d; want 200", code)
		}
		for _, want := range []string{
			"lockproxy_lock_acquire_total",
			`lockproxy_lock_acquire_total{result="acquired"}`,
			`lockproxy_lock_acquire_total{result="not_acquired"}`,
			"lockproxy_node_request_duration_seconds",
		} {
			if !strings.Contains(body, want) {
				t.Errorf("/metrics lacks %q", want)
			}
		}
		for _, secret := range []string{key, tok, g.Token, "secret-"} {
			if strings.Contains(body, secret) {
				t.Errorf("/metrics contains the lock key or token %q", secret)
			}
		}

		// One node down: still ready.
		cl.nodes[n-1].Kill()
		if code, body := httpGet(t, base+"/readyz"); code != 200 {
			t.Errorf("GET /readyz with one node down = %d %q; want 200", code, body)
		}
		// A majority down: not ready, but alive.
		for _, nd := range cl.nodes[n-1-n/2 : n-1] {
			nd.Kill()
		}
		err := eventually(20, 250*time.Millisecond, func() error {
			if code, body := httpGet(t, base+"/readyz"); code != 503 {
				return fmt.Errorf("GET /readyz with %d/%d nodes down = %d %q; want 503", n/2+1, n, code, body)
			}
			return nil
		})
		if err != nil {
			t.Error(err)
		}
		if code, body := httpGet(t, base+"/healthz"); code != 200 {
			t.Errorf("GET /healthz with a majority down = %d %q; want 200 (liveness)", code, body)
		}
	})
}

func TestSIGTERMGracefulShutdown(t *testing.T) {
	t.Parallel()
	eachSize(t, func(t *testing.T, n int) {
		cl := startCluster(t, n)
		in := startInstance(t, cl.addrs())

		// An idle connection and one that holds a lock stay open.
		idle := lc.DialRaw(t, in.addr)
		if r := idle.Do("PING"); r.Str != "PONG" {
			t.Fatalf("PING = %v", r)
		}
		c := lc.NewClient(t, in.addr, 3)
		lc.MustLock(t, c, "shutdown-"+lockclient.RandID(), "PX", 10000)

		start := time.Now()
		if err := in.proc.Signal(syscall.SIGTERM); err != nil {
			t.Fatalf("SIGTERM: %v", err)
		}
		code, err := in.proc.Wait(10 * time.Second)
		took := time.Since(start)
		if err != nil {
			t.Fatalf("lockproxy did not exit within 10 s of SIGTERM: %v", err)
		}
		if code != 0 {
			t.Errorf("exit code after SIGTERM = %d; want 0", code)
		}
		if took > 5*time.Second {
			t.Errorf("exit took %v after SIGTERM; want < 5s", took)
		}
		t.Logf("exited %d after %v", code, took)
		if err := listenerClosed(in.addr); err != nil {
			t.Error(err)
		}
	})
}

// listenerClosed reports an error if addr still accepts connections.
func listenerClosed(addr string) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err == nil {
		c.Close()
		return fmt.Errorf("%s still accepts connections after lockproxy exited", addr)
	}
	return nil
}
