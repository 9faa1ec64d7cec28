package redis

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
)

// TestTransparentSettleManyKeysAtOnce: a transparent write on several lock
// keys waits, on each node, for what is queued on its keys' writers (see
// settleKeys) once, not key after key. Here n2's one writer (Workers 1)
// spends 20 ms on each batch with a fresh grant while LOCKs keep it busy.
// A script on 20 keys waited for a batch per key before, about 20 × 20 ms:
// it ran into settleKeys' cap, half its 1 s fan-out timeout (503 ms), and
// went out with the rest of its keys unordered, the overtaking settle is
// there to prevent. Now it waits for one or two batches (35–57 ms).
func TestTransparentSettleManyKeysAtOnce(t *testing.T) {
	b, _ := newRealBackend(t, 3)
	ctx := ctxTimeout(t, 30*time.Second)
	n2 := b.nodes[2]
	// Set before the first operation is queued: the writer reads it
	// after receiving one.
	n2.beforeFenceStore = func() { time.Sleep(20 * time.Millisecond) }
	stop := make(chan struct{})
	var wg sync.WaitGroup
	defer wg.Wait()
	defer close(stop)
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				// Fresh grants, each with its fence write.
				_, _ = b.Lock(ctx, backends.LockRequest{Key: fmt.Sprintf("load-%d-%d", g, i), Token: "x", TTL: 10 * time.Second})
			}
		}()
	}
	time.Sleep(100 * time.Millisecond)
	keys := make([]string, 20)
	for i := range keys {
		keys[i] = fmt.Sprintf("lock:many%d", i)
	}
	// A write waits only for keys with operations queued (inFlight):
	// each of these keys is counted as having one on n2, as when their
	// LOCKs are still queued there, so the script waits for n2's writer.
	for _, k := range keys {
		n2.inFlight[slot(k)].Add(1)
	}
	defer func() {
		for _, k := range keys {
			n2.inFlight[slot(k)].Add(-1)
		}
	}()
	var worst time.Duration
	for range 3 {
		start := time.Now()
		rs := b.RunScript(ctx, `return 1`, keys, nil)
		took := time.Since(start)
		for i, r := range rs {
			if r.Err != nil || r.Val != int64(1) {
				t.Errorf("n%d: %v, %v", i, r.Val, r.Err)
			}
		}
		t.Logf("%d keys: %v", len(keys), took)
		worst = max(worst, took)
	}
	if worst > 250*time.Millisecond {
		t.Errorf("a script on %d keys took %v with n2's writer at 20 ms a batch; want its keys' writer waited for once (< 250 ms)", len(keys), worst)
	}
}

// TestTransparentSettleEachWriterOfTheKeys: with several writers per node,
// a script on keys of two writers waits for both, whichever key comes
// first (settleKeys queues one marker per writer). n2's writer of key is
// held while the SET NX of key is granted by n0 and n1; the
// compare-and-delete script names a key of another writer first.
func TestTransparentSettleEachWriterOfTheKeys(t *testing.T) {
	const workers = 4
	b, rs := newRealBackend(t, 3, func(c *Config) {
		for i := range c.Nodes {
			c.Nodes[i].Workers = workers
		}
	})
	ctx := ctxTimeout(t, 30*time.Second)
	writerOf := func(k string) int { return int(slot(k)) % workers }
	const key, token = "lock:py", "with-token"
	other, first := "", ""
	for i := 0; other == "" || first == ""; i++ {
		k := fmt.Sprintf("k%d", i)
		switch {
		case other == "" && writerOf(k) == writerOf(key):
			other = k
		case first == "" && writerOf(k) != writerOf(key):
			first = k
		}
	}
	n2 := b.nodes[2]
	held, resume := make(chan struct{}), make(chan struct{})
	n2.beforeFenceStore = func() {
		n2.beforeFenceStore = nil
		close(held)
		<-resume
	}
	resumed := false
	defer func() {
		if !resumed {
			close(resume)
		}
	}()
	if _, err := b.Lock(ctx, backends.LockRequest{Key: other, Token: "o", TTL: time.Minute, NoReentry: true}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-held:
	case <-time.After(5 * time.Second):
		t.Fatal("n2's writer did not reach the grant's fence write")
	}
	if _, err := b.Lock(ctx, backends.LockRequest{Key: key, Token: token, TTL: 10 * time.Second, NoReentry: true}); err != nil {
		t.Fatalf("SET NX with n2's writer held: %v", err)
	}
	const release = `if redis.call("get", KEYS[2]) == ARGV[1] then return redis.call("del", KEYS[2]) end return 0`
	replies := make(chan []backends.NodeReply, 1)
	go func() { replies <- b.RunScript(ctx, release, []string{first, key}, []string{token}) }()
	var got []backends.NodeReply
	select {
	case got = <-replies:
		t.Errorf("the release was answered while n2's acquire was still queued: %+v", got)
	case <-time.After(200 * time.Millisecond):
	}
	close(resume)
	resumed = true
	if got == nil {
		got = <-replies
	}
	for i, r := range got {
		if r.Err != nil || r.Val != int64(1) {
			t.Errorf("n%d: release = %v, %v; want 1, after its acquire", i, r.Val, r.Err)
		}
	}
	for i, r := range rs {
		if n := r.Client(t).Exists(ctx, "lp:lock:"+key).Val(); n != 0 {
			t.Errorf("n%d still has the released key", i)
		}
	}
}
