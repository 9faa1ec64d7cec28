package relay

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/test/harness"
)

// TestRedirectTargetNamedDuringUnpin: a client's clean unpin
// (commands' maybeUnpin, or relayAdd giving a lingering pin back) checks
// RedirectTarget and then calls Unpin(true), not atomically: another
// client's CLIENT TRACKING … REDIRECT may run Named in between. Named then
// hands out the connection's upstream id (the redirection gets +OK), and
// Unpin(true) closes the connection, which is named: the tracking client's
// invalidations go to a connection that no longer exists while the client
// it redirected to is still connected (its cache is never invalidated).
// A clean Unpin must keep a connection Named made a redirection's target.
func TestRedirectTargetNamedDuringUnpin(t *testing.T) {
	up := harness.StartRedis(t, harness.RedisOptions{})
	r := New(Config{Addr: up.Addr, PoolSize: 2, DialTimeout: time.Second, ReadTimeout: 5 * time.Second})
	t.Cleanup(r.Close)
	p := r.NewPipe(7, nil, nil)
	defer p.Done()
	if err := p.Pin(context.Background(), 2, 0); err != nil {
		t.Fatal(err)
	}
	// The target's goroutine: its state is done with, and RedirectTarget
	// says no...
	if p.RedirectTarget() {
		t.Fatal("a fresh pin is a redirection's target")
	}
	// ...when another client's CLIENT TRACKING … REDIRECT 7 runs.
	id, err := r.Named(7, NameRedirect)
	if err != nil {
		t.Fatalf("Named = %v", err)
	}
	p.Unpin(true)
	if !p.Pinned() || p.pin.failed() != nil || p.pin.id != id {
		t.Fatalf("the connection of upstream id %d, which a redirection was just given, left its client (pinned %v)", id, p.Pinned())
	}
	p.Add([][]byte{[]byte("CLIENT"), []byte("ID")})
	b, err := p.Collect(context.Background(), 2, true)
	if err != nil {
		t.Fatal(err)
	}
	if want := ":" + strconv.FormatInt(id, 10) + "\r\n"; string(b) != want {
		t.Errorf("the client's CLIENT ID upstream = %q; want %q", b, want)
	}
}
