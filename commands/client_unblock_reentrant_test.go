package commands

import (
	"context"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/backends/redis"
)

// lateGrantReal is a RedLock backend whose LOCK … WAIT grants, and then
// answers only once its wait was canceled: the grant landed as CLIENT
// UNBLOCK came.
type lateGrantReal struct{ *redis.Backend }

func (b lateGrantReal) Lock(ctx context.Context, req backends.LockRequest) (backends.Lease, error) {
	l, err := b.Backend.Lock(ctx, req)
	if req.Wait > 0 {
		<-ctx.Done()
	}
	return l, err
}

// TestClientUnblockReentrantLateGrantKeepsEarlierHold: a reentrant LOCK
// (or RLOCK, a downgrade) … TOKEN t WAIT that CLIENT UNBLOCK ended after
// its grant landed gives back the one hold it added, not the token's
// earlier hold, which its client still owns: one UNLOCK releases that,
// and then the key is free.
func TestClientUnblockReentrantLateGrantKeepsEarlierHold(t *testing.T) {
	be := newRealRedLock(t, 3)
	proxy, _ := proxyWithUpstream(t, Options{Backend: lateGrantReal{be}})
	for i, tc := range []struct{ first, second, o1, o2 string }{
		{"LOCK", "LOCK", "", ""}, {"LOCK", "RLOCK", "", ""}, {"RLOCK", "RLOCK", "", ""},
		{"LOCK", "LOCK", " KEEPALIVE", ""}, {"LOCK", "LOCK", " KEEPALIVE", " KEEPALIVE"}, {"LOCK", "RLOCK", " KEEPALIVE", " KEEPALIVE"},
	} {
		t.Run(tc.first+tc.o1+"/"+tc.second+tc.o2, func(t *testing.T) {
			key := "zzre" + string(rune('a'+i))
			waiter, other := dialRaw(t, proxy), dialRaw(t, proxy)
			cmd := tc.first + " " + key + " PX 10000 TOKEN t" + tc.o1
			readLease(t, waiter, cmd, waiter.do(t, cmd))
			id := clientID(t, waiter)
			blockOn(t, waiter, tc.second+" "+key+" PX 10000 TOKEN t WAIT 5000"+tc.o2)
			if got := other.do(t, "CLIENT UNBLOCK "+id); got != ":1" {
				t.Fatalf("UNBLOCK = %q", got)
			}
			if got := waiter.reply(t); got != "$-1" {
				t.Fatalf("got %q", got)
			}
			time.Sleep(100 * time.Millisecond)
			if got := waiter.do(t, "UNLOCK "+key+" t"); got != ":1" {
				t.Errorf("UNLOCK of the earlier hold = %q; want :1", got)
			}
			if got := waiter.do(t, "UNLOCK "+key+" t"); got != ":0" {
				t.Errorf("second UNLOCK = %q; want :0", got)
			}
			if got := other.do(t, "LOCK "+key+" PX 1000"); got != "*6" {
				t.Errorf("LOCK by another after = %q", got)
			}
		})
	}
}
