package postgres

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockproxy/lockproxy/test/fault"
	"github.com/lockproxy/lockproxy/test/lockclient"
)

// TestNoOverlapAcrossInstances: 8 clients, 4 on each of two lockproxies on
// one database, take one key 100 times each with a short lease; one grant
// in 50 is left to expire instead of being unlocked. Every holder records
// its grant (after the reply) and its validity deadline, and the fault
// suite's checker finds no two holders' intervals overlapping and no fence
// that does not grow.
func TestNoOverlapAcrossInstances(t *testing.T) {
	// Mostly waiting on leases, on tables of its own: it runs beside the
	// package's other long tests (see Makefile: make test's last slot).
	t.Parallel()
	const (
		clients = 8
		grants  = 100
		ttlMS   = 300
	)
	prefix := newPrefix()
	insts := []*instance{startInstance(t, shared.DSN(), prefix), startInstance(t, shared.DSN(), prefix)}
	key := "history-" + lockclient.RandID()
	h := fault.NewHistory()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	errs := make(chan error, clients)
	var wg sync.WaitGroup
	for i := range clients {
		c := lc.NewClient(t, insts[i%2].addr, 2+i%2)
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- runClient(ctx, c, h, key, fmt.Sprintf("c%d@%d", i, i%2), i, grants, ttlMS)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	r := fault.Check(h.Grants())
	t.Logf("%s", r)
	if r.Grants != clients*grants {
		t.Errorf("%d grants recorded; want %d", r.Grants, clients*grants)
	}
	if r.Violations() > 0 {
		t.Errorf("mutual exclusion or fencing broken: %s", r)
	}
}

// runClient takes key n times, waiting as long as it takes (bounded by
// ctx), and records each grant in h.
func runClient(ctx context.Context, c *redis.Client, h *fault.History, key, name string, seed, n, ttlMS int) error {
	for i := 0; i < n; {
		if ctx.Err() != nil {
			return fmt.Errorf("%s: %d grants of %d before the deadline", name, i, n)
		}
		g, ok, err := lockclient.TryLock(ctx, c, key, "PX", ttlMS, "WAIT", 10000)
		enter := h.Now()
		if errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("%s: %d grants of %d before the deadline", name, i, n)
		}
		if err != nil {
			return fmt.Errorf("%s grant %d: %v", name, i, err)
		}
		if !ok {
			// WAIT ran out behind the others: try again.
			continue
		}
		i++
		rec := fault.Grant{
			Key: key, Token: g.Token, Fence: g.Fence, Client: name,
			Enter: enter, Deadline: enter + time.Duration(g.ValidityMS)*time.Millisecond, Exit: -1,
		}
		if (seed+i)%50 == 0 {
			// Left to expire: the holder's interval ends at its deadline.
			h.Add(rec)
			continue
		}
		time.Sleep(time.Duration((seed*7+i)%3) * time.Millisecond)
		rec.Exit = h.Now()
		h.Add(rec)
		if err := c.Do(ctx, "UNLOCK", key, g.Token).Err(); err != nil {
			return fmt.Errorf("%s UNLOCK %d: %v", name, i, err)
		}
	}
	return nil
}
