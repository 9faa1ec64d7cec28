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
// shared machine's load falls on all three alike. The ratios are taken
// within each round, where the three ran under the same load, and the
// median round's ratio is reported with the range over the rounds.

const (
	passRounds  = 5
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
	// The same build with two threads fixed, for what procs: auto (one
	// thread until lockproxy uses most of a core) makes of it.
	lp2 := fmt.Sprintf("127.0.0.1:%d", harness.FreePort(b))
	p2 := harness.StartProc(b, bin, "--dev", "--listen", lp2, "--admin", "", "--upstream", up.Addr, "--log-level", "warn", "--procs", "2")
	if err := harness.WaitTCP(lp2, startTimeout); err != nil {
		b.Fatalf("lockproxy --procs 2 did not listen: %v\n%s", err, p2.Output())
	}
	tw, twp := startTwemproxy(b, up.Addr)

	targets := []struct {
		name, addr string
		pid        int // the proxy's, whose cost per request is measured; 0 for direct
	}{{"direct", up.Addr, 0}, {"lockproxy", lp, p.PID()}, {"twemproxy", tw, twp.PID()}, {"lockproxy --procs 2", lp2, p2.PID()}}
	type key struct {
		target, test string
		pipeline     int
	}
	rps := map[key][]float64{}
	type costKey struct {
		target   string
		pipeline int
	}
	costs := map[costKey][]procCost{}
	for round := 0; round < passRounds; round++ {
		for _, pl := range []int{1, 16} {
			for _, tg := range targets {
				before, okBefore := readProcCost(tg.pid)
				res := redisBenchmark(b, tg.addr, pl)
				after, okAfter := readProcCost(tg.pid)
				for test, v := range res {
					k := key{tg.name, test, pl}
					rps[k] = append(rps[k], v)
				}
				if okBefore && okAfter {
					ck := costKey{tg.name, pl}
					costs[ck] = append(costs[ck], after.sub(before, 2*passRequests(pl)))
				}
			}
		}
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "\npassthrough: redis-benchmark -t set,get -c %d, %d interleaved rounds: requests/s of the median round, and each ratio's median over the rounds (range)\n\n", passClients, passRounds)
	sb.WriteString("| test | pipeline | direct | lockproxy | twemproxy | lockproxy/direct | twemproxy/direct | lockproxy/twemproxy |\n")
	sb.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, pl := range []int{1, 16} {
		for _, test := range []string{"SET", "GET"} {
			d, l, t := rps[key{"direct", test, pl}], rps[key{"lockproxy", test, pl}], rps[key{"twemproxy", test, pl}]
			fmt.Fprintf(&sb, "| %s | %d | %.0f | %.0f | %.0f | %s | %s | %s |\n", test, pl, median(d), median(l), median(t),
				ratioCell(l, d), ratioCell(t, d), ratioCell(l, t))
		}
	}
	fmt.Fprintf(&sb, "\nlockproxy with procs: auto (the default: one thread at this load) and with --procs 2, same rounds\n\n")
	sb.WriteString("| test | pipeline | auto | --procs 2 | auto/(--procs 2) |\n")
	sb.WriteString("|---|---:|---:|---:|---:|\n")
	for _, pl := range []int{1, 16} {
		for _, test := range []string{"SET", "GET"} {
			a, two := rps[key{"lockproxy", test, pl}], rps[key{"lockproxy --procs 2", test, pl}]
			fmt.Fprintf(&sb, "| %s | %d | %.0f | %.0f | %s |\n", test, pl, median(a), median(two), ratioCell(a, two))
		}
	}
	// What the proxies cost per request (SET and GET together) is steadier
	// on a shared machine than their throughput, and shows where the
	// time goes: nearly all of it is system calls.
	fmt.Fprintf(&sb, "\nproxy process cost per request (median round; CPU from /proc/PID/stat, system calls from /proc/PID/io)\n\n")
	sb.WriteString("| pipeline | proxy | CPU µs/request | reads/request | writes/request |\n")
	sb.WriteString("|---:|---|---:|---:|---:|\n")
	for _, pl := range []int{1, 16} {
		for _, tg := range []string{"lockproxy", "lockproxy --procs 2", "twemproxy"} {
			c := costs[costKey{tg, pl}]
			if len(c) == 0 {
				continue
			}
			cpu, rd, wr := make([]float64, len(c)), make([]float64, len(c)), make([]float64, len(c))
			for i, x := range c {
				cpu[i], rd[i], wr[i] = x.cpuMicros, x.reads, x.writes
			}
			fmt.Fprintf(&sb, "| %d | %s | %.2f | %.2f | %.2f |\n", pl, tg, median(cpu), median(rd), median(wr))
		}
	}
	fmt.Print(sb.String())
}

// procCost is a process's CPU time and read and write system calls, or
// (after sub) their amounts per request.
type procCost struct {
	cpuMicros     float64
	reads, writes float64
}

// clockTicks is Linux's USER_HZ, the unit of /proc/PID/stat's times.
const clockTicks = 100

// readProcCost reads pid's CPU time and system call counts; false for pid
// 0 or when /proc cannot tell.
func readProcCost(pid int) (procCost, bool) {
	if pid == 0 {
		return procCost{}, false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return procCost{}, false
	}
	// Fields after the command name, which may hold spaces: state is the
	// first, utime and stime the 12th and 13th.
	i := strings.LastIndexByte(string(stat), ')')
	f := strings.Fields(string(stat[i+1:]))
	if i < 0 || len(f) < 13 {
		return procCost{}, false
	}
	ut, err1 := strconv.ParseFloat(f[11], 64)
	st, err2 := strconv.ParseFloat(f[12], 64)
	io, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", pid))
	if err1 != nil || err2 != nil || err != nil {
		return procCost{}, false
	}
	c := procCost{cpuMicros: (ut + st) * 1e6 / clockTicks}
	for _, line := range strings.Split(string(io), "\n") {
		name, v, _ := strings.Cut(line, ": ")
		n, _ := strconv.ParseFloat(strings.TrimSpace(v), 64)
		switch name {
		case "syscr":
			c.reads = n
		case "syscw":
			c.writes = n
		}
	}
	return c, true
}

// sub is the cost per request between before and c, over n requests.
func (c procCost) sub(before procCost, n int) procCost {
	return procCost{
		cpuMicros: (c.cpuMicros - before.cpuMicros) / float64(n),
		reads:     (c.reads - before.reads) / float64(n),
		writes:    (c.writes - before.writes) / float64(n),
	}
}

// passRequests is how many requests of each test one redis-benchmark run
// sends.
func passRequests(pipeline int) int {
	if pipeline > 1 {
		return 500000
	}
	return 100000
}

// median is the middle value (the upper one of an even count); 0 for none.
// ratioCell is the median and the range of the per-round ratios a/b.
func ratioCell(a, b []float64) string {
	var r []float64
	for i := range min(len(a), len(b)) {
		if b[i] > 0 {
			r = append(r, a[i]/b[i])
		}
	}
	if len(r) == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f (%.2f–%.2f)", median(r), slices.Min(r), slices.Max(r))
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

// redisBenchmark runs redis-benchmark against addr and returns requests/s
// per test (SET, GET).
func redisBenchmark(b *testing.B, addr string, pipeline int) map[string]float64 {
	host, port, _ := strings.Cut(addr, ":")
	n := passRequests(pipeline)
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
func startTwemproxy(b *testing.B, upstream string) (string, *harness.Proc) {
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
	return addr, p
}
