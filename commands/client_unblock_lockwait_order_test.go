package commands

import (
	"context"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
)

// neverGrantBackend is a backend whose LOCK … WAIT waits until its
// context ends and is not granted: a key held by someone else.
type neverGrantBackend struct{ fakeBackend }

func (b *neverGrantBackend) Lock(ctx context.Context, req backends.LockRequest) (backends.Lease, error) {
	if req.Wait <= 0 {
		return backends.Lease{}, backends.ErrNotAcquired
	}
	t := time.NewTimer(req.Wait)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
	return backends.Lease{}, backends.ErrNotAcquired
}

// TestClientUnblockOfLockWaitAfterPipelinedWrites: on Redis a client's
// commands run in the order it sent them, so a CLIENT UNBLOCK pipelined
// after a SET wakes the blocked client only once the SET has run, and
// what the woken client reads next sees it. lockproxy ends a LOCK … WAIT
// itself (lockWaits), while relayed commands before the UNBLOCK wait in
// the client's pipe for the batch's end: the waiter was woken before
// the SET reached the upstream, and read the old value. The upstream's
// writes are paused (CLIENT PAUSE … WRITE) to hold the SET, as a busy
// upstream would.
func TestClientUnblockOfLockWaitAfterPipelinedWrites(t *testing.T) {
	proxy, upstream := proxyWithUpstream(t, Options{Backend: &neverGrantBackend{}})
	waiter, other, admin := dialRaw(t, proxy), dialRaw(t, proxy), dialRaw(t, upstream)
	if got := other.do(t, "SET unblockorder:flag old"); got != "+OK" {
		t.Fatalf("SET = %q", got)
	}
	id := clientID(t, waiter)
	blockOn(t, waiter, "LOCK unblockorder:k PX 10000 WAIT 8000")
	if got := admin.do(t, "CLIENT PAUSE 600 WRITE"); got != "+OK" {
		t.Fatalf("CLIENT PAUSE = %q", got)
	}
	if _, err := other.c.Write([]byte("SET unblockorder:flag new\r\nCLIENT UNBLOCK " + id + "\r\n")); err != nil {
		t.Fatal(err)
	}
	_ = waiter.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if got := waiter.reply(t); got != "$-1" {
		t.Fatalf("LOCK … WAIT after CLIENT UNBLOCK = %q; want $-1", got)
	}
	if got := waiter.do(t, "GET unblockorder:flag"); got != "new" {
		t.Errorf("GET by the client a CLIENT UNBLOCK woke = %q; want \"new\", set by the SET sent before the UNBLOCK", got)
	}
	_ = other.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if got := other.reply(t); got != "+OK" {
		t.Errorf("SET = %q", got)
	}
	if got := other.reply(t); got != ":1" {
		t.Errorf("CLIENT UNBLOCK = %q; want :1", got)
	}
}
