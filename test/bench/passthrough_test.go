package bench

import (
	"context"
	"encoding/csv"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/test/harness"
)

// The passthrough table: redis-benchmark -t set,get -c 50, without and
// with -P 16, directly against one redis-server, through lockproxy's relay
// and through twemproxy (nutcracker), interleaved in rounds so that the
// shared machine's load falls on all three alike; the median round counts.

const (
	passRounds  = 3
	passClients = 50
)

var passOnce sync.Once

// BenchmarkPassthrough prints the passthrough table; it runs once whatever
// b.N is (the numbers come from redis-benchmark).
func BenchmarkPassthrough(b *testing.B) {
	passOnce.Do(func() { passthrough(b) })
}

func passthrough(b *testing.B) {
	harness.RequireBinary(b, "redis-benchmark", "redis-tools")
	harness.RequireBinary(b, "nutcracker", "nutcracker")
	up := harness.StartRedis(b, harness.RedisOptions{})
	bin := harness.BuildLockproxy(b)
	lp := fmt.Sprintf("127.0.0.1:%d", harness.FreePort(b))
	p := harness.StartProc(b, bin, "--dev", "--listen", lp, "--admin", "", "--upstream", up.Addr, "--log-level", "warn")
	if err := harness.WaitTCP(lp, startTimeout); err != nil {
		b.Fatalf("lockproxy did not listen: %v\n%s", err, p.Output())
	}
	tw := startTwemproxy(b, up.Addr)

	targets := []struct{ name, addr string }{{"direct", up.Addr}, {"lockproxy", lp}, {"twemproxy", tw}}
	type key struct {
		target, test string
		pipeline     int
	}
	rps := map[key][]float64{}
	for round := 0; round < passRounds; round++ {
		for _, pl := range []int{1, 16} {
			for _, tg := range targets {
				for test, v := range redisBenchmark(b, tg.addr, pl) {
					k := key{tg.name, test, pl}
					rps[k] = append(rps[k], v)
				}
			}
		}
	}
	median := func(v []float64) float64 {
		if len(v) == 0 {
			return 0
		}
		s := slices.Clone(v)
		slices.Sort(s)
		return s[len(s)/2]
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "\npassthrough: redis-benchmark -t set,get -c %d, median of %d interleaved rounds (requests/s)\n\n", passClients, passRounds)
	sb.WriteString("| test | pipeline | direct | lockproxy | twemproxy | lockproxy/direct | twemproxy/direct | lockproxy/twemproxy |\n")
	sb.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, pl := range []int{1, 16} {
		for _, test := range []string{"SET", "GET"} {
			d, l, t := median(rps[key{"direct", test, pl}]), median(rps[key{"lockproxy", test, pl}]), median(rps[key{"twemproxy", test, pl}])
			fmt.Fprintf(&sb, "| %s | %d | %.0f | %.0f | %.0f | %.2f | %.2f | %.2f |\n", test, pl, d, l, t, l/d, t/d, l/t)
		}
	}
	fmt.Print(sb.String())
}

// redisBenchmark runs redis-benchmark against addr and returns requests/s
// per test (SET, GET).
func redisBenchmark(b *testing.B, addr string, pipeline int) map[string]float64 {
	host, port, _ := strings.Cut(addr, ":")
	n := 100000
	if pipeline > 1 {
		n = 500000
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "redis-benchmark", "-h", host, "-p", port, "-t", "set,get",
		"-c", strconv.Itoa(passClients), "-n", strconv.Itoa(n), "-P", strconv.Itoa(pipeline), "--csv")
	out, err := cmd.Output()
	if err != nil {
		b.Fatalf("redis-benchmark %s -P %d: %v\n%s", addr, pipeline, err, out)
	}
	recs, err := csv.NewReader(strings.NewReader(string(out))).ReadAll()
	if err != nil {
		b.Fatalf("redis-benchmark output: %v\n%s", err, out)
	}
	res := map[string]float64{}
	for _, r := range recs {
		if len(r) < 2 {
			continue
		}
		if v, err := strconv.ParseFloat(r[1], 64); err == nil {
			res[r[0]] = v
		}
	}
	if len(res) != 2 {
		b.Fatalf("redis-benchmark %s: want SET and GET, got %v\n%s", addr, res, out)
	}
	return res
}

// startTwemproxy runs nutcracker in front of upstream on a free port.
func startTwemproxy(b *testing.B, upstream string) string {
	dir := b.TempDir()
	addr := fmt.Sprintf("127.0.0.1:%d", harness.FreePort(b))
	conf := fmt.Sprintf("alpha:\n  listen: %s\n  redis: true\n  hash: fnv1a_64\n  distribution: ketama\n"+
		"  auto_eject_hosts: false\n  timeout: 5000\n  server_connections: 1\n  servers:\n   - %s:1\n", addr, upstream)
	path := filepath.Join(dir, "nutcracker.yml")
	if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
		b.Fatal(err)
	}
	stats := strconv.Itoa(harness.FreePort(b))
	p := harness.StartProc(b, "nutcracker", "-c", path, "-s", stats, "-a", "127.0.0.1", "-o", filepath.Join(dir, "nutcracker.log"))
	if err := harness.WaitTCP(addr, startTimeout); err != nil {
		b.Fatalf("nutcracker did not listen: %v\n%s", err, p.Output())
	}
	return addr
}
