package postgres

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
)

// TestWaitingWriterNotStarvedByHeldBackReaders: a writer waits (its
// marker holds new readers back) while readers on three other instances
// keep trying RLOCK without WAIT, each first try queueing on the key's
// advisory lock only to be refused. Once the reader that held the key
// releases it, the writer, woken by the NOTIFY, must get it soon; three
// rounds. Its retries only tried the advisory lock
// (pg_try_advisory_xact_lock), which the readers' first tries, queued in
// the database one after another, kept taken nearly all the time: the key
// stayed free with nobody granted, the writer for up to seconds (0.8–5.4
// s, once its whole WAIT) and every reader held back by it.
func TestWaitingWriterNotStarvedByHeldBackReaders(t *testing.T) {
	pg, p := testDB(t)
	b := newTestBackend(t, pg, p, 4)
	readers := []*Backend{newTestBackend(t, pg, p, 4), newTestBackend(t, pg, p, 4), newTestBackend(t, pg, p, 4)}
	waitListening(t, b)
	ctx := context.Background()
	conn := pg.Conn(t)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var tries atomic.Int64
	for _, rb := range readers {
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					tok := newID()
					if _, err := rb.Lock(ctx, backends.LockRequest{Key: "k", Token: tok, TTL: time.Minute, Mode: backends.Read}); err == nil {
						_, _ = rb.Unlock(ctx, "k", tok)
					}
					tries.Add(1)
				}
			}()
		}
	}
	defer func() {
		close(stop)
		wg.Wait()
	}()
	var worst time.Duration
	for round := range 3 {
		r := fmt.Sprint("R", round)
		if _, err := b.Lock(ctx, backends.LockRequest{Key: "k", Token: r, TTL: time.Minute, Mode: backends.Read, Wait: 10 * time.Second}); err != nil {
			t.Fatalf("round %d: %s's RLOCK: %v", round, r, err)
		}
		type result struct {
			at  time.Time
			err error
		}
		done := make(chan result, 1)
		w := fmt.Sprint("W", round)
		go func() {
			_, err := b.Lock(ctx, backends.LockRequest{Key: "k", Token: w, TTL: time.Minute, Wait: 5 * time.Second})
			done <- result{time.Now(), err}
		}()
		// The writer waits and holds new readers back; the readers
		// granted before its marker have let go.
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			var marks, others int
			if err := conn.QueryRow(ctx, `SELECT (SELECT count(*) FROM `+p+`waiting_writers),
				(SELECT count(*) FROM `+p+`holds WHERE token <> $1 AND expires_at > clock_timestamp())`, r).Scan(&marks, &others); err != nil {
				t.Fatal(err)
			}
			if marks > 0 && others == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("round %d: the writer did not wait alone behind %s", round, r)
			}
		}
		time.Sleep(100 * time.Millisecond) // the readers' refused tries under way
		if ok, err := b.Unlock(ctx, "k", r); !ok || err != nil {
			t.Fatal(ok, err)
		}
		free := time.Now()
		res := <-done
		took := res.at.Sub(free)
		t.Logf("round %d: writer %v, %v after the key was free; readers' tries so far %d", round, res.err, took.Round(time.Millisecond), tries.Load())
		if res.err != nil {
			t.Fatalf("round %d: the waiting writer was not granted (%v) though the key was free", round, res.err)
		}
		worst = max(worst, took)
		if ok, err := b.Unlock(ctx, "k", w); !ok || err != nil {
			t.Fatal(ok, err)
		}
	}
	if worst > 500*time.Millisecond {
		t.Errorf("a waiting writer was granted %v after the key was free; want within 500 ms", worst.Round(time.Millisecond))
	}
}
