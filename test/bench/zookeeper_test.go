package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockproxy/lockproxy/test/harness"
)

// zkNodes is the size of both stores in BenchmarkBackends: a three-server
// ZooKeeper ensemble and three Redis nodes.
const zkNodes = 3

// zkWarmupCycles is the least warm-up of each ZooKeeper sub-benchmark.
const zkWarmupCycles = 2000

// backendSetup is one lockproxy in front of one store, and the processes
// whose CPU the store costs.
type backendSetup struct {
	name   string
	proxy  *harness.Proc
	store  []int // PIDs
	client *redis.Client
	c      *cluster // only its run counter is used
}

// BenchmarkBackends measures LOCK+UNLOCK cycles through lockproxy on its
// two backends in the same run, interleaved: RedLock over three Redis
// nodes and ZooKeeper on a three-server ensemble, at 1, 16 and 64 clients,
// each client on its own key. It prints a table of both at the end.
func BenchmarkBackends(b *testing.B) {
	maxClients := clientCounts[len(clientCounts)-1]
	setups := []*backendSetup{startRedlockSetup(b, maxClients), startZookeeperSetup(b, maxClients)}
	var rows []backendRow
	b.Cleanup(func() { printBackendRows(rows) })
	for _, clients := range clientCounts {
		b.Run(fmt.Sprintf("clients=%d", clients), func(b *testing.B) {
			for _, s := range setups {
				b.Run("backend="+s.name, func(b *testing.B) {
					r := runBackend(b, s, clients)
					for i := range rows {
						if rows[i].clients == clients && rows[i].backend == s.name {
							rows[i].result = r // the last (reported) run wins
							return
						}
					}
					rows = append(rows, backendRow{clients: clients, backend: s.name, result: r})
				})
			}
		})
	}
}

func startRedlockSetup(b *testing.B, maxClients int) *backendSetup {
	nodes := harness.StartRedisN(b, zkNodes, harness.RedisOptions{})
	s := &backendSetup{name: "redlock", c: &cluster{}}
	s.proxy, s.client = startBenchProxy(b, maxClients, nil, "--nodes", strings.Join(harness.Addrs(nodes), ","))
	for _, n := range nodes {
		s.store = append(s.store, n.PID())
	}
	return s
}

func startZookeeperSetup(b *testing.B, maxClients int) *backendSetup {
	zs := harness.StartZooKeeperEnsemble(b, zkNodes)
	s := &backendSetup{name: "zookeeper", c: &cluster{}}
	s.proxy, s.client = startBenchProxy(b, maxClients, []string{"LOCKPROXY_ZOOKEEPER_ROOT=/bench"},
		"--backend", "zookeeper", "--zk", strings.Join(harness.ZKAddrs(zs), ","))
	for _, z := range zs {
		s.store = append(s.store, z.PID())
	}
	return s
}

func startBenchProxy(b *testing.B, maxClients int, env []string, args ...string) (*harness.Proc, *redis.Client) {
	b.Helper()
	addr := "127.0.0.1:" + strconv.Itoa(harness.FreePort(b))
	cmd := exec.Command(harness.BuildLockproxy(b), append([]string{"--listen", addr, "--admin", "", "--log-level", "warn"}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	proxy := harness.StartCmd(b, cmd)
	if err := harness.WaitTCP(addr, 60*time.Second); err != nil {
		b.Fatalf("lockproxy %v did not start: %v\n%s", args, err, proxy.Output())
	}
	c := redis.NewClient(clientOptions(addr, maxClients))
	b.Cleanup(func() { _ = c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		b.Fatalf("PING lockproxy: %v\n%s", err, proxy.Output())
	}
	return proxy, c
}

var warmedBackends sync.Map

func runBackend(b *testing.B, s *backendSetup, clients int) result {
	im := impl{name: s.name, cycle: lockproxyCycle(s.client)}
	if _, warm := warmedBackends.LoadOrStore(b.Name(), true); !warm {
		n := clients * warmupCycles
		if s.name == "zookeeper" {
			// The JVM compiles the servers' hot paths over the first
			// thousands of requests; measure after that, not during it.
			n = max(n, zkWarmupCycles)
		}
		if r := cycles(s.c, im, clients, n); r.failures > 0 {
			b.Fatalf("warm-up: %d of %d cycles failed; first: %v", r.failures, r.cycles, r.firstErr)
		}
	}
	cpu := func() (proxy, store time.Duration) {
		for _, pid := range s.store {
			store += procCPU(pid)
		}
		return procCPU(s.proxy.PID()), store
	}
	p0, s0 := cpu()
	b.ResetTimer()
	r := cycles(s.c, im, clients, b.N)
	b.StopTimer()
	p1, s1 := cpu()
	res := summarize(b, r)
	res.proxyCPU = float64((p1 - p0).Microseconds()) / float64(r.cycles)
	res.redisCPU = float64((s1 - s0).Microseconds()) / float64(r.cycles)
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(res.cyclesPerSec, "cycles/s")
	b.ReportMetric(ms(res.p50), "p50-ms")
	b.ReportMetric(ms(res.p99), "p99-ms")
	b.ReportMetric(res.proxyCPU, "proxy-cpu-us/cycle")
	b.ReportMetric(res.redisCPU, "store-cpu-us/cycle")
	return res
}

type backendRow struct {
	clients int
	backend string
	result  result
}

func printBackendRows(rows []backendRow) {
	if len(rows) == 0 {
		return
	}
	fmt.Println("\nlockproxy LOCK+UNLOCK cycles by backend (3 Redis nodes / 3 ZooKeeper servers), each client on its own key:")
	fmt.Println()
	fmt.Println("| clients | backend | cycles/s | p50 | p99 | proxy CPU µs/cycle | store CPU µs/cycle |")
	fmt.Println("|---:|---|---:|---:|---:|---:|---:|")
	for _, r := range rows {
		fmt.Printf("| %d | %s | %.0f | %.2f ms | %.2f ms | %.0f | %.0f |\n", r.clients, r.backend,
			r.result.cyclesPerSec, ms(r.result.p50), ms(r.result.p99), r.result.proxyCPU, r.result.redisCPU)
	}
}
