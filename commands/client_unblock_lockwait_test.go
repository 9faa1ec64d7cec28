package commands

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
)

// readLease reads the rest of a RESP2 LOCK reply whose first line was
// *6 (token, validity_ms, fence and their names), or fails the test with
// what came instead.
func readLease(t *testing.T, c *rawConn, cmd, first string) {
	t.Helper()
	if first != "*6" {
		t.Fatalf("%s = %q; want the lease (*6)", cmd, first)
	}
	for range 6 {
		c.reply(t)
	}
}

// TestClientUnblockEndsLockWait: on Redis, CLIENT UNBLOCK id of a client
// in a blocking command answers :1, and the command returns at once as on
// its timeout (CLIENT UNBLOCK id [TIMEOUT]) or with -UNBLOCKED (CLIENT
// UNBLOCK id ERROR). A client waiting in lockproxy's own LOCK … WAIT or
// RLOCK … WAIT is blocked in lockproxy, not upstream: the UNBLOCK was
// relayed, found no blocked upstream connection, and answered :0 while
// the LOCK waited out its WAIT. The wait ends as a WAIT that ran out, so
// it leaves nothing on any node: no hold once the holder unlocks, no
// writer's mark keeping readers out.
func TestClientUnblockEndsLockWait(t *testing.T) {
	be, nodes := newRealRedLockNodes(t, 3)
	proxy, _ := proxyWithUpstream(t, Options{Backend: be})
	tests := []struct {
		name, wait, reason, want string
	}{
		{"LOCK, no reason", "LOCK", "", "$-1"},
		{"LOCK, TIMEOUT", "LOCK", " TIMEOUT", "$-1"},
		{"LOCK, ERROR", "LOCK", " ERROR", "-" + errUnblocked},
		{"RLOCK, timeout", "RLOCK", " timeout", "$-1"},
		{"RLOCK, ERROR", "RLOCK", " ERROR", "-" + errUnblocked},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			key := "unblockwait" + string(rune('a'+i))
			holder, waiter, other := dialRaw(t, proxy), dialRaw(t, proxy), dialRaw(t, proxy)
			cmd := "LOCK " + key + " PX 10000 TOKEN holder"
			readLease(t, holder, cmd, holder.do(t, cmd))
			id := clientID(t, waiter)
			blockOn(t, waiter, tc.wait+" "+key+" PX 10000 WAIT 8000")
			start := time.Now()
			if got := other.do(t, "CLIENT UNBLOCK "+id+tc.reason); got != ":1" {
				t.Errorf("CLIENT UNBLOCK %s%s of a client in %s … WAIT = %q; want :1", id, tc.reason, tc.wait, got)
			}
			got := waiter.reply(t)
			if waited := time.Since(start); got != tc.want || waited > 2*time.Second {
				t.Errorf("%s … WAIT 8000 after CLIENT UNBLOCK%s = %q after %v; want %q at once",
					tc.wait, tc.reason, got, waited.Round(time.Millisecond), tc.want)
			}
			if got := other.do(t, "CLIENT UNBLOCK "+id+tc.reason); got != ":0" {
				t.Errorf("CLIENT UNBLOCK of a client no longer blocked = %q; want :0", got)
			}
			if got := waiter.do(t, "PING"); got != "+PONG" {
				t.Fatalf("the unblocked client's PING = %q", got)
			}
			if got := holder.do(t, "UNLOCK "+key+" holder"); got != ":1" {
				t.Fatalf("the holder's UNLOCK = %q", got)
			}
			// Nothing of the wait on any node: no write hold, no read
			// hold, and (checked by the RLOCK below) no writer's mark.
			// UNLOCK answers once a majority released: the last node
			// gets a moment, far below the 10 s a hold left would last.
			for _, n := range nodes {
				c := dialRaw(t, n.Addr)
				for _, k := range []string{"lock:", "lockm:", "lockr:", "lockrh:"} {
					got := c.do(t, "EXISTS lp:"+k+key)
					for end := time.Now().Add(time.Second); got != ":0" && time.Now().Before(end); {
						time.Sleep(20 * time.Millisecond)
						got = c.do(t, "EXISTS lp:"+k+key)
					}
					if got != ":0" {
						t.Errorf("node %s has lp:%s%s (%s, pttl %s) after the holder's UNLOCK: the unblocked %s left something held",
							n.Addr, k, key, c.do(t, "TYPE lp:"+k+key), c.do(t, "PTTL lp:"+k+key), tc.wait)
					}
				}
			}
			// PX 10000: PX 1000's 10 ms node timeouts fail on a loaded host.
			for _, probe := range []string{"LOCK " + key + " PX 10000 TOKEN probe", "RLOCK " + key + " PX 10000 TOKEN probe"} {
				readLease(t, other, probe, other.do(t, probe))
				if got := other.do(t, "UNLOCK "+key+" probe"); got != ":1" {
					t.Fatalf("UNLOCK of %s = %q", probe, got)
				}
			}
		})
	}
}

// grantOnCancelBackend is a backend whose LOCK … WAIT grants the lock
// just as its wait is canceled: a grant that landed as CLIENT UNBLOCK
// came, which backends may answer for an attempt canceled mid-way. Its
// releases are counted (fakeBackend).
type grantOnCancelBackend struct{ fakeBackend }

func (b *grantOnCancelBackend) Lock(ctx context.Context, req backends.LockRequest) (backends.Lease, error) {
	if req.Wait > 0 {
		<-ctx.Done()
	}
	return backends.Lease{Token: req.Token, Validity: req.TTL, Fence: 1}, nil
}

// TestClientUnblockGivesBackLateGrant: a LOCK … WAIT that CLIENT UNBLOCK
// ended (:1) answers as unblocked even when the backend granted the lock
// meanwhile, and the grant is released, in the mode it was taken: no
// client was told of it, so it would stay held for its whole TTL.
func TestClientUnblockGivesBackLateGrant(t *testing.T) {
	tests := []struct{ cmd, kind string }{
		{"LOCK", backends.Write.String()},
		{"RLOCK", backends.Read.String()},
	}
	for _, tc := range tests {
		t.Run(tc.cmd, func(t *testing.T) {
			be := &grantOnCancelBackend{}
			proxy, _ := proxyWithUpstream(t, Options{Backend: be})
			waiter, other := dialRaw(t, proxy), dialRaw(t, proxy)
			id := clientID(t, waiter)
			blockOn(t, waiter, tc.cmd+" late PX 10000 WAIT 5000")
			if got := other.do(t, "CLIENT UNBLOCK "+id); got != ":1" {
				t.Fatalf("CLIENT UNBLOCK %s = %q; want :1", id, got)
			}
			if got := waiter.reply(t); got != "$-1" {
				t.Errorf("%s … WAIT after CLIENT UNBLOCK = %q; want $-1 (not acquired), the grant given back", tc.cmd, got)
			}
			be.mu.Lock()
			kinds := strings.Join(be.unlockKinds, ",")
			be.mu.Unlock()
			if kinds != tc.kind {
				t.Errorf("releases after the unblocked %s = %q; want one %s release of the grant that landed", tc.cmd, kinds, tc.kind)
			}
		})
	}
}

// TestClientUnblockWithoutUpstream: without an upstream, CLIENT UNBLOCK
// ends lockproxy's own LOCK and RLOCK … WAIT as it does with one (it was
// "unknown subcommand"), answers :0 for a client in no wait, and gives
// Redis's errors for bad arguments.
func TestClientUnblockWithoutUpstream(t *testing.T) {
	be, _ := newRealRedLockNodes(t, 3)
	_, c0 := serveHandler(t, be, nil)
	addr := c0.RemoteAddr().String()
	holder, waiter, other := dialRaw(t, addr), dialRaw(t, addr), dialRaw(t, addr)
	for i, tc := range []struct{ wait, reason, want string }{
		{"LOCK", "", "$-1"},
		{"RLOCK", " TIMEOUT", "$-1"},
		{"LOCK", " error", "-" + errUnblocked},
	} {
		key := "unblocklocal" + string(rune('a'+i))
		cmd := "LOCK " + key + " PX 10000 TOKEN holder"
		readLease(t, holder, cmd, holder.do(t, cmd))
		id := clientID(t, waiter)
		blockOn(t, waiter, tc.wait+" "+key+" PX 10000 WAIT 8000")
		start := time.Now()
		if got := other.do(t, "CLIENT UNBLOCK "+id+tc.reason); got != ":1" {
			t.Errorf("CLIENT UNBLOCK %s%s of a client in %s … WAIT = %q; want :1", id, tc.reason, tc.wait, got)
		}
		if got, waited := waiter.reply(t), time.Since(start); got != tc.want || waited > 2*time.Second {
			t.Errorf("%s … WAIT 8000 after CLIENT UNBLOCK%s = %q after %v; want %q at once",
				tc.wait, tc.reason, got, waited.Round(time.Millisecond), tc.want)
		}
		if got := other.do(t, "CLIENT UNBLOCK "+id); got != ":0" {
			t.Errorf("CLIENT UNBLOCK of a client no longer blocked = %q; want :0", got)
		}
		if got := holder.do(t, "UNLOCK "+key+" holder"); got != ":1" {
			t.Fatalf("the holder's UNLOCK = %q", got)
		}
	}
	for _, tc := range []struct{ cmd, want string }{
		{"CLIENT UNBLOCK 999999", ":0"},
		{"CLIENT UNBLOCK " + clientID(t, other), ":0"},
		{"CLIENT UNBLOCK", "-ERR wrong number of arguments for 'client|unblock' command"},
		{"CLIENT UNBLOCK 1 TIMEOUT x", "-ERR unknown subcommand or wrong number of arguments for 'UNBLOCK'. Try CLIENT HELP."},
		{"CLIENT UNBLOCK 1 SOMETIMES", "-ERR CLIENT UNBLOCK reason should be TIMEOUT or ERROR"},
		{"CLIENT UNBLOCK x", "-" + errNotInteger.Error()},
	} {
		if got := other.do(t, tc.cmd); got != tc.want {
			t.Errorf("%s = %q; want %q", tc.cmd, got, tc.want)
		}
	}
	if got := other.do(t, "PING"); got != "+PONG" {
		t.Fatalf("PING after the errors = %q", got)
	}
}
