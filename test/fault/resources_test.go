package fault

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/test/lockclient"
)

// Resource checks of a row: every lockproxy instance must end the row with
// about as many goroutines as it had before the workload (no goroutine per
// connection, wait or lock left behind), and its memory must stay bounded
// however many grants the row made.

const (
	// goroutineSlack is how many goroutines above its baseline an
	// instance may keep after a row. Measured rows end exactly at their
	// baseline (28); each instance serves 10 workload clients, so a leak
	// of one goroutine per connection (10) or per grant (thousands) is
	// caught, while a timer or check in flight is not mistaken for one.
	goroutineSlack = 5
	// goroutineSettle bounds the wait for goroutines to wind down after
	// the clients closed (connections close asynchronously; a node link
	// healed from a blackhole reconnects).
	goroutineSettle = 20 * time.Second
	// maxHeapInuse and maxRSS bound an instance's memory during a row.
	// Rows measure 30–45 MiB of heap in use (more when a loaded host
	// delays the collector) and 45–60 MiB RSS, the same at 10,000 and at
	// 200,000 grants (soak); growth with grants or connections would
	// cross these.
	maxHeapInuse = 128 << 20
	maxRSS       = 256 << 20
)

// adminGet fetches path from the instance's admin listener.
func (p *proxy) adminGet(ctx context.Context, path string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.admin+path, nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", fmt.Errorf("GET %s%s: %w", p.admin, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", fmt.Errorf("GET %s%s: %w", p.admin, path, err)
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET %s%s: %s", p.admin, path, resp.Status)
	}
	return string(b), nil
}

// goroutines reads the instance's goroutine count from
// /debug/pprof/goroutine?debug=1 and returns the profile too (for the
// failure message).
func (p *proxy) goroutines(ctx context.Context) (int, string, error) {
	prof, err := p.adminGet(ctx, "/debug/pprof/goroutine?debug=1")
	if err != nil {
		return 0, "", err
	}
	first, _, _ := strings.Cut(prof, "\n")
	n, err := strconv.Atoi(strings.TrimPrefix(first, "goroutine profile: total "))
	if err != nil {
		return 0, prof, fmt.Errorf("goroutine profile header %q: %w", first, err)
	}
	return n, prof, nil
}

// memory reads go_memstats_heap_inuse_bytes and
// process_resident_memory_bytes from the instance's /metrics.
func (p *proxy) memory(ctx context.Context) (heapInuse, rss float64, err error) {
	body, err := p.adminGet(ctx, "/metrics")
	if err != nil {
		return 0, 0, err
	}
	found := 0
	sc := bufio.NewScanner(strings.NewReader(body))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		name, val, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			continue
		}
		var dst *float64
		switch name {
		case "go_memstats_heap_inuse_bytes":
			dst = &heapInuse
		case "process_resident_memory_bytes":
			dst = &rss
		default:
			continue
		}
		if *dst, err = strconv.ParseFloat(val, 64); err != nil {
			return 0, 0, fmt.Errorf("metric %s: %w", name, err)
		}
		found++
	}
	if found != 2 {
		return 0, 0, fmt.Errorf("/metrics of %s: heap in use or RSS missing", p.addr)
	}
	return heapInuse, rss, nil
}

// resourceWatch samples the instances' memory through a row and holds
// their goroutine baselines.
type resourceWatch struct {
	proxies []*proxy
	base    []int
	stop    chan struct{}
	done    chan struct{}

	mu                         sync.Mutex
	firstHeap, maxHeap, maxRSS []float64
	samples                    int
}

// watchResources records each instance's goroutine count now (before the
// workload) and samples memory every 250 ms until finish. Samples that
// fail (an instance down by design) are skipped.
func watchResources(t *testing.T, proxies []*proxy) *resourceWatch {
	t.Helper()
	w := &resourceWatch{proxies: proxies, stop: make(chan struct{}), done: make(chan struct{}),
		firstHeap: make([]float64, len(proxies)), maxHeap: make([]float64, len(proxies)), maxRSS: make([]float64, len(proxies))}
	for _, p := range proxies {
		n, _, err := p.goroutines(lockclient.CtxFor(t, 10*time.Second))
		if err != nil {
			t.Fatalf("goroutine baseline: %v", err)
		}
		w.base = append(w.base, n)
	}
	go func() {
		defer close(w.done)
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		for {
			w.sample()
			select {
			case <-w.stop:
				return
			case <-tick.C:
			}
		}
	}()
	return w
}

func (w *resourceWatch) sample() {
	for i, p := range w.proxies {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		heap, rss, err := p.memory(ctx)
		cancel()
		if err != nil {
			continue
		}
		w.mu.Lock()
		if w.firstHeap[i] == 0 {
			w.firstHeap[i] = heap
		}
		w.maxHeap[i], w.maxRSS[i] = max(w.maxHeap[i], heap), max(w.maxRSS[i], rss)
		w.samples++
		w.mu.Unlock()
	}
}

// resourceReport is what finish measured, for the row's log line.
type resourceReport struct {
	base, after                []int
	firstHeap, maxHeap, maxRSS float64
	samples                    int
}

func (r resourceReport) String() string {
	return fmt.Sprintf("goroutines %v → %v, heap in use %.1f → max %.1f MiB, max RSS %.1f MiB (%d samples)",
		r.base, r.after, r.firstHeap/(1<<20), r.maxHeap/(1<<20), r.maxRSS/(1<<20), r.samples)
}

// finish stops sampling (after the clients closed), then checks each
// instance: its goroutines back within goroutineSlack of the baseline
// (waiting up to goroutineSettle), its memory within the bounds.
func (w *resourceWatch) finish(t *testing.T) resourceReport {
	t.Helper()
	r, problems := w.measure(goroutineSettle, maxHeapInuse, maxRSS)
	for _, p := range problems {
		t.Error(p)
	}
	return r
}

// measure stops sampling and returns what it found and every bound broken:
// goroutines still above baseline + goroutineSlack after settle, memory
// above maxHeap or maxRSS.
func (w *resourceWatch) measure(settle time.Duration, maxHeap, maxRSS float64) (resourceReport, []string) {
	close(w.stop)
	<-w.done
	w.sample()
	var problems []string
	w.mu.Lock()
	r := resourceReport{base: w.base, samples: w.samples}
	for i := range w.proxies {
		r.firstHeap = max(r.firstHeap, w.firstHeap[i])
		r.maxHeap, r.maxRSS = max(r.maxHeap, w.maxHeap[i]), max(r.maxRSS, w.maxRSS[i])
	}
	w.mu.Unlock()
	if r.samples == 0 {
		problems = append(problems, "no memory sample of any lockproxy instance")
	}
	if r.maxHeap > maxHeap || r.maxRSS > maxRSS {
		problems = append(problems, fmt.Sprintf("lockproxy memory: max heap in use %.1f MiB, max RSS %.1f MiB; want ≤ %.0f MiB and ≤ %.0f MiB",
			r.maxHeap/(1<<20), r.maxRSS/(1<<20), maxHeap/(1<<20), maxRSS/(1<<20)))
	}
	for i, p := range w.proxies {
		var n int
		var prof string
		var err error
		for end := time.Now().Add(settle); ; {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			n, prof, err = p.goroutines(ctx)
			cancel()
			if (err == nil && n <= w.base[i]+goroutineSlack) || time.Now().After(end) {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		r.after = append(r.after, n)
		switch {
		case err != nil:
			problems = append(problems, fmt.Sprintf("instance %s: goroutine count after the row: %v", p.addr, err))
		case n > w.base[i]+goroutineSlack:
			problems = append(problems, fmt.Sprintf("instance %s: %d goroutines %v after the row; baseline %d (+%d allowed): leak?\n%s",
				p.addr, n, settle, w.base[i], goroutineSlack, prof))
		}
	}
	return r, problems
}
