package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/go-redsync/redsync/v4"
	redsyncredis "github.com/go-redsync/redsync/v4/redis"
	goredispool "github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/lockproxy/lockproxy/test/harness"
)

const (
	// lockTTL is the lease both implementations ask for: long enough that
	// no lease expires within a cycle, even on a loaded machine.
	lockTTL = 10 * time.Second
	// opTimeout bounds one LOCK or UNLOCK; a cycle slower than this is a
	// failure, not a data point.
	opTimeout = 5 * time.Second
	// maxFailRatio is the share of failed cycles above which a benchmark
	// fails: a fast but broken implementation must not produce numbers.
	maxFailRatio = 0.001
	// warmupCycles per client, run once per sub-benchmark before the
	// first timed run, so pool dials and the proxy's node connections are
	// not measured.
	warmupCycles = 20
	// startTimeout bounds the wait for lockproxy to answer PING.
	startTimeout = 15 * time.Second
)

var (
	nodeCounts   = []int{3, 5}
	clientCounts = []int{1, 16, 64}
)

func TestMain(m *testing.M) {
	code := m.Run()
	printResults(os.Stdout)
	os.Exit(code)
}

// BenchmarkLockCycle measures LOCK+UNLOCK cycles through lockproxy and with
// redsync directly on the same nodes, at several client counts.
func BenchmarkLockCycle(b *testing.B) {
	for _, n := range nodeCounts {
		b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) {
			// A benchmark with sub-benchmarks runs its body once, so the
			// nodes and the proxy live exactly as long as this group; the
			// harness's cleanups (registered on this b) stop them by PID.
			c := startCluster(b, n, slices.Max(clientCounts))
			for _, clients := range clientCounts {
				b.Run(fmt.Sprintf("clients=%d", clients), func(b *testing.B) {
					for _, impl := range c.impls {
						b.Run("impl="+impl.name, func(b *testing.B) {
							runCycles(b, c, impl, clients)
						})
					}
					b.Run("interleaved", func(b *testing.B) {
						runInterleaved(b, c, clients)
					})
				})
			}
		})
	}
}

// ---------------------------------------------------------------------------
// Setup

// cycleFunc does one LOCK+UNLOCK on key and reports why it failed, if it did.
type cycleFunc func(ctx context.Context, key string) error

type impl struct {
	name  string
	cycle cycleFunc
}

// cluster is one set of redis-server nodes with a lockproxy in front.
type cluster struct {
	nodes []*harness.Redis
	proxy *harness.Proc
	impls []impl // lockproxy first, then redsync: the run order

	mu     sync.Mutex
	warmed map[string]bool // sub-benchmark names already warmed up
	// medians are the interleaved rounds' median ratios, by benchmark name.
	medians map[string]float64
	runs    atomic.Int64 // distinguishes keys across runs
}

func clientOptions(addr string, poolSize int) *redis.Options {
	return &redis.Options{
		Addr:                  addr,
		Protocol:              2,
		PoolSize:              poolSize,
		MaxRetries:            -1, // a failure must show, not be retried away
		DialTimeout:           2 * time.Second,
		ContextTimeoutEnabled: true,
		DisableIdentity:       true,
		MaintNotificationsConfig: &maintnotifications.Config{
			Mode: maintnotifications.ModeDisabled,
		},
	}
}

func startCluster(b *testing.B, n, maxClients int) *cluster {
	b.Helper()
	nodes := harness.StartRedisN(b, n, harness.RedisOptions{})
	bin := harness.BuildLockproxy(b)
	addr := "127.0.0.1:" + strconv.Itoa(harness.FreePort(b))
	proxy := harness.StartProc(b, bin,
		"--listen", addr,
		"--admin", "",
		"--nodes", strings.Join(harness.Addrs(nodes), ","),
		"--log-level", "warn")
	if err := harness.WaitTCP(addr, startTimeout); err != nil {
		b.Fatalf("lockproxy did not start: %v\n%s", err, proxy.Output())
	}

	lp := redis.NewClient(clientOptions(addr, maxClients))
	b.Cleanup(func() { _ = lp.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	if err := lp.Ping(ctx).Err(); err != nil {
		b.Fatalf("PING lockproxy: %v\n%s", err, proxy.Output())
	}

	pools := make([]redsyncredis.Pool, 0, n)
	for _, node := range nodes {
		nc := redis.NewClient(clientOptions(node.Addr, maxClients))
		b.Cleanup(func() { _ = nc.Close() })
		pools = append(pools, goredispool.NewPool(nc))
	}
	rs := redsync.New(pools...)

	return &cluster{
		nodes: nodes,
		proxy: proxy,
		impls: []impl{
			{"lockproxy", lockproxyCycle(lp)},
			{"redsync", redsyncCycle(rs)},
		},
		warmed: map[string]bool{}, medians: map[string]float64{},
	}
}

// ---------------------------------------------------------------------------
// The two cycles

// lockproxyCycle checks the whole RESP2 lease, [token, t, validity_ms, n,
// fence, n], and that UNLOCK answered 1.
func lockproxyCycle(c *redis.Client) cycleFunc {
	return func(ctx context.Context, key string) error {
		v, err := c.Do(ctx, "LOCK", key, "PX", lockTTL.Milliseconds()).Slice()
		if err != nil {
			return fmt.Errorf("LOCK %q: %w", key, err)
		}
		if len(v) != 6 || v[0] != "token" || v[2] != "validity_ms" || v[4] != "fence" {
			return fmt.Errorf("LOCK %q = %v; want [token t validity_ms n fence n]", key, v)
		}
		token, _ := v[1].(string)
		validity, _ := v[3].(int64)
		if _, ok := v[5].(int64); !ok || token == "" || validity <= 0 {
			return fmt.Errorf("LOCK %q = %v; want a token, positive validity and a fence", key, v)
		}
		n, err := c.Do(ctx, "UNLOCK", key, token).Int64()
		if err != nil {
			return fmt.Errorf("UNLOCK %q: %w", key, err)
		}
		if n != 1 {
			return fmt.Errorf("UNLOCK %q = %d; want 1", key, n)
		}
		return nil
	}
}

func redsyncCycle(rs *redsync.Redsync) cycleFunc {
	return func(ctx context.Context, key string) error {
		m := rs.NewMutex(key, redsync.WithExpiry(lockTTL), redsync.WithTries(1))
		if err := m.LockContext(ctx); err != nil {
			return fmt.Errorf("redsync Lock %q: %w", key, err)
		}
		ok, err := m.UnlockContext(ctx)
		if err != nil {
			return fmt.Errorf("redsync Unlock %q: %w", key, err)
		}
		if !ok {
			return fmt.Errorf("redsync Unlock %q = false; want true", key)
		}
		return nil
	}
}

// ---------------------------------------------------------------------------
// Running

// run is the outcome of one call of a sub-benchmark's body.
type run struct {
	cycles    int
	failures  int
	firstErr  error
	elapsed   time.Duration
	latencies []time.Duration // of the successful cycles, sorted
	cpu       cpuUse
}

func runCycles(b *testing.B, c *cluster, im impl, clients int) {
	c.mu.Lock()
	warm := c.warmed[b.Name()]
	c.warmed[b.Name()] = true
	c.mu.Unlock()
	if !warm {
		if r := cycles(c, im, clients, clients*warmupCycles); r.failures > 0 {
			b.Fatalf("warm-up: %d of %d cycles failed; first: %v", r.failures, r.cycles, r.firstErr)
		}
	}

	before, m0 := c.cpu(), readMachine()
	b.ResetTimer()
	r := cycles(c, im, clients, b.N)
	b.StopTimer()
	r.cpu = c.cpu().sub(before)
	machine := shareSince(m0, readMachine())

	res := summarize(b, r)
	perCycle := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(r.cycles) }
	res.benchCPU, res.proxyCPU, res.redisCPU = perCycle(r.cpu.bench), perCycle(r.cpu.proxy), perCycle(r.cpu.redis)
	res.machine = machine

	b.ReportMetric(0, "ns/op") // cycles/s says it without the split across clients
	b.ReportMetric(res.cyclesPerSec, "cycles/s")
	b.ReportMetric(ms(res.p50), "p50-ms")
	b.ReportMetric(ms(res.p99), "p99-ms")
	b.ReportMetric(res.benchCPU, "bench-cpu-us/cycle")
	if im.name == "lockproxy" {
		b.ReportMetric(res.proxyCPU, "proxy-cpu-us/cycle")
	}
	b.ReportMetric(res.redisCPU, "redis-cpu-us/cycle")
	if machine.ok {
		b.ReportMetric(machine.idle, "idle-%")
		b.ReportMetric(machine.steal, "steal-%")
	}
	if r.failures > 0 {
		b.ReportMetric(float64(r.failures), "failures")
	}
	// The testing package calls this body with growing b.N; the last call
	// is the one it reports, so it overwrites earlier ones here too.
	record(len(c.nodes), clients, im.name, res)
}

// summarize fails b when more than maxFailRatio of r's cycles failed or
// none succeeded, and gives r's rate and latencies.
func summarize(b *testing.B, r run) result {
	b.Helper()
	if r.failures > 0 && float64(r.failures) > maxFailRatio*float64(r.cycles) {
		b.Fatalf("%d of %d cycles failed (more than %.1f %%); first: %v",
			r.failures, r.cycles, 100*maxFailRatio, r.firstErr)
	}
	if len(r.latencies) == 0 {
		b.Fatalf("no successful cycle; first error: %v", r.firstErr)
	}
	return result{
		cyclesPerSec: float64(len(r.latencies)) / r.elapsed.Seconds(),
		p50:          percentile(r.latencies, 50),
		p99:          percentile(r.latencies, 99),
		failures:     r.failures,
		cycles:       r.cycles,
	}
}

// Interleaved rounds: the machine is shared, and load from elsewhere that
// falls on one implementation's whole run and not the other's skews a
// ratio of two back-to-back runs. Short rounds that alternate the two, with
// the median of the per-round ratios, are far steadier.
const (
	interleavedRounds = 7
	roundLength       = time.Second
)

// runInterleaved measures lockproxy and redsync in alternating rounds of
// roundLength and records the per-round ratios. It runs once per point,
// whatever b.N is.
func runInterleaved(b *testing.B, c *cluster, clients int) {
	c.mu.Lock()
	done := c.warmed[b.Name()]
	c.warmed[b.Name()] = true
	med, measured := c.medians[b.Name()]
	c.mu.Unlock()
	if done || len(c.impls) != 2 {
		// The testing package calls again with a larger b.N: report
		// what the one measurement found.
		b.ReportMetric(0, "ns/op")
		if measured {
			b.ReportMetric(med, "median-ratio")
		}
		return
	}
	var ratios []float64
	m0 := readMachine()
	for round := 0; round < interleavedRounds; round++ {
		var rates [2]float64
		for i, im := range c.impls {
			// Alternate which goes first, so neither always follows the
			// other's leftovers (keys expiring, sockets closing).
			if round%2 == 1 {
				im = c.impls[1-i]
			}
			r := cyclesFor(c, im, clients, 0, time.Now().Add(roundLength))
			if r.failures > 0 && float64(r.failures) > maxFailRatio*float64(r.cycles) {
				b.Fatalf("%s: %d of %d cycles failed; first: %v", im.name, r.failures, r.cycles, r.firstErr)
			}
			rate := float64(len(r.latencies)) / r.elapsed.Seconds()
			if im.name == "lockproxy" {
				rates[0] = rate
			} else {
				rates[1] = rate
			}
		}
		if rates[1] > 0 {
			ratios = append(ratios, rates[0]/rates[1])
		}
	}
	if len(ratios) == 0 {
		b.Fatal("no interleaved round completed")
	}
	machine := shareSince(m0, readMachine())
	slices.Sort(ratios)
	med = ratios[len(ratios)/2]
	c.mu.Lock()
	c.medians[b.Name()] = med
	c.mu.Unlock()
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(med, "median-ratio")
	if machine.ok {
		b.ReportMetric(machine.steal, "steal-%")
	}
	recordInterleaved(len(c.nodes), clients, ratios, machine)
}

// cycles runs total cycles on clients goroutines, each with its own key,
// taking work from a shared counter so b.N need not divide evenly.
func cycles(c *cluster, im impl, clients, total int) run {
	return cyclesFor(c, im, clients, total, time.Time{})
}

// cyclesFor runs cycles until total are done (total > 0) or until the
// clock passes until (until not zero), whichever comes first.
func cyclesFor(c *cluster, im impl, clients, total int, until time.Time) run {
	runID := c.runs.Add(1)
	var next atomic.Int64
	type share struct {
		lat      []time.Duration
		failures int
		firstErr error
	}
	shares := make([]share, clients)
	var wg sync.WaitGroup
	start := time.Now()
	for g := range clients {
		wg.Go(func() {
			sh := &shares[g]
			sh.lat = make([]time.Duration, 0, total/clients+1)
			key := fmt.Sprintf("bench:%s:r%d:g%d", im.name, runID, g)
			for total <= 0 || next.Add(1) <= int64(total) {
				if !until.IsZero() && time.Now().After(until) {
					break
				}
				ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
				t0 := time.Now()
				err := im.cycle(ctx, key)
				d := time.Since(t0)
				cancel()
				if err != nil {
					if sh.failures == 0 {
						sh.firstErr = err
					}
					sh.failures++
					// The key may still be held on some nodes; move on
					// rather than fail every later cycle for 10 s.
					key = fmt.Sprintf("bench:%s:r%d:g%d:f%d", im.name, runID, g, sh.failures)
					continue
				}
				sh.lat = append(sh.lat, d)
			}
		})
	}
	wg.Wait()
	r := run{cycles: total, elapsed: time.Since(start)}
	if total <= 0 {
		for _, sh := range shares {
			r.cycles += len(sh.lat) + sh.failures
		}
	}
	var errs []error
	for _, sh := range shares {
		r.latencies = append(r.latencies, sh.lat...)
		r.failures += sh.failures
		if sh.firstErr != nil {
			errs = append(errs, sh.firstErr)
		}
	}
	if len(errs) > 0 {
		r.firstErr = errs[0]
	}
	slices.Sort(r.latencies)
	return r
}

// percentile returns the nearest-rank p-th percentile of sorted.
func percentile(sorted []time.Duration, p int) time.Duration {
	i := (len(sorted)*p + 99) / 100
	return sorted[max(i-1, 0)]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// ---------------------------------------------------------------------------
// CPU accounting

// cpuUse is user+system CPU time of the benchmark process (the clients,
// and for redsync the whole algorithm), the lockproxy process and the
// redis-server nodes together.
type cpuUse struct{ bench, proxy, redis time.Duration }

func (u cpuUse) sub(v cpuUse) cpuUse {
	return cpuUse{u.bench - v.bench, u.proxy - v.proxy, u.redis - v.redis}
}

func (c *cluster) cpu() cpuUse {
	var u cpuUse
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		u.bench = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	u.proxy = procCPU(c.proxy.PID())
	for _, n := range c.nodes {
		u.redis += procCPU(n.PID())
	}
	return u
}

// procCPU returns utime+stime of pid from /proc (10 ms resolution), or 0.
func procCPU(pid int) time.Duration {
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	// Fields after the parenthesised command name; utime and stime are
	// fields 14 and 15 of the whole line, in USER_HZ (100 on Linux).
	s := string(raw)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0
	}
	const userHZ = 100
	return time.Duration(ut+st) * time.Second / userHZ
}

// machineTicks is the whole machine's CPU time from /proc/stat's first
// line, in USER_HZ ticks summed over CPUs: all of it, the idle part, and
// the steal part (time the hypervisor gave this machine's CPUs to others
// while they had work). Steal is load from outside that neither side of a
// comparison controls; a run with much of it measures the host.
type machineTicks struct{ total, idle, steal float64 }

func readMachine() machineTicks {
	raw, err := os.ReadFile("/proc/stat")
	if err != nil {
		return machineTicks{}
	}
	line, _, _ := strings.Cut(string(raw), "\n")
	return parseCPULine(line)
}

// parseCPULine reads /proc/stat's "cpu" line: user nice system idle iowait
// irq softirq steal, then guest and guest_nice, which user and nice
// already count. Anything else gives the zero value (not measured).
func parseCPULine(line string) machineTicks {
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return machineTicks{}
	}
	var t machineTicks
	for i, s := range f[1:9] {
		v, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return machineTicks{}
		}
		t.total += v
		switch i {
		case 3, 4: // idle, iowait
			t.idle += v
		case 7:
			t.steal += v
		}
	}
	return t
}

// machineShare is the idle and steal percentages of the machine's CPU
// time between two readings; ok is false where /proc/stat is missing.
type machineShare struct {
	idle, steal float64
	ok          bool
}

func shareSince(before, after machineTicks) machineShare {
	d := after.total - before.total
	if d <= 0 || before.total == 0 {
		return machineShare{}
	}
	return machineShare{idle: 100 * (after.idle - before.idle) / d, steal: 100 * (after.steal - before.steal) / d, ok: true}
}
