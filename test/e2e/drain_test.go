package e2e

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/test/lockclient"
)

// TestReadyzDuringDrain: once SIGTERM starts the drain, /readyz answers
// 503 "draining" while an in-flight LOCK … WAIT still keeps the process
// up, so that a load balancer stops sending clients to an instance that
// no longer accepts them.
func TestReadyzDuringDrain(t *testing.T) {
	t.Parallel()
	cl := startCluster(t, 3)
	in := startInstance(t, cl.addrs())
	readyz := "http://" + in.admin + "/readyz"

	// A held key and a client waiting for it: the drain waits for the
	// waiter's LOCK, which runs for its WAIT.
	const wait = 4 * time.Second
	key := "drain-" + lockclient.RandID()
	holder := lc.DialRaw(t, in.addr)
	rawGrant(t, holder, key, "PX", "30000")
	waiter := lc.DialRaw(t, in.addr)
	waiter.Write(lockclient.Encode("LOCK", key, "PX", "10000", "WAIT", fmt.Sprint(wait.Milliseconds())))
	// The waiter is waiting now (INFO's blocked_clients): a LOCK not yet
	// read when SIGTERM comes is not waited for, its connection closed.
	waitBlocked(t, lc.NewClient(t, in.addr, 2), 1)

	if code, body, err := probe(readyz); err != nil || code != http.StatusOK {
		t.Fatalf("GET /readyz before SIGTERM = %d %q, %v; want 200", code, body, err)
	}
	start := time.Now()
	if err := in.proc.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("SIGTERM: %v", err)
	}
	var last string
	for {
		code, body, err := probe(readyz)
		if err == nil && code == http.StatusServiceUnavailable && strings.TrimSpace(body) == "draining" {
			t.Logf("/readyz answered 503 draining %v after SIGTERM", time.Since(start))
			break
		}
		last = fmt.Sprintf("%d %q, %v", code, body, err)
		if err != nil || time.Since(start) > wait/2 {
			t.Fatalf("GET /readyz during the drain = %s (%v after SIGTERM, exited %v); want 503 draining", last, time.Since(start), in.proc.Exited())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if in.proc.Exited() {
		t.Fatal("lockproxy exited before the waiter's LOCK finished; the drain was not tested")
	}
	// The drain then ends as before: the waiter is answered, the process
	// exits 0.
	if r, err := waiter.ReadWithin(2 * wait); err != nil {
		t.Errorf("the waiter's LOCK during the drain: %v; want a reply", err)
	} else {
		t.Logf("the waiter's LOCK during the drain = %v", r)
	}
	if code, err := in.proc.Wait(10 * time.Second); err != nil || code != 0 {
		t.Errorf("exit after SIGTERM = %d, %v; want 0", code, err)
	}
}

// probe GETs url and returns the status code and body, or the error (a
// refused connection once the admin listener is closed).
func probe(url string) (int, string, error) {
	c := &http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, string(body), err
}
