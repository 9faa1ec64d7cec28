package bench

import (
	"fmt"
	"io"
	"sync"
	"time"
)

// result is what one sub-benchmark measured in its last (reported) run.
type result struct {
	cyclesPerSec float64
	p50, p99     time.Duration
	cycles       int
	failures     int
	// CPU microseconds per cycle: benchmark process, lockproxy, all nodes.
	benchCPU, proxyCPU, redisCPU float64
	// The machine's idle and steal shares during the run.
	machine machineShare
}

type rowKey struct{ nodes, clients int }

// interleaved holds, per point, the lockproxy/redsync ratios of the
// alternating rounds, sorted, and the machine's steal share over them.
var (
	interleaved      = map[rowKey][]float64{}
	interleavedSteal = map[rowKey]machineShare{}
)

func recordInterleaved(nodes, clients int, ratios []float64, m machineShare) {
	results.mu.Lock()
	defer results.mu.Unlock()
	interleaved[rowKey{nodes, clients}] = ratios
	interleavedSteal[rowKey{nodes, clients}] = m
}

// row pairs the two implementations measured at one nodes × clients point.
type row struct {
	rowKey
	lockproxy, redsync *result
}

// results collects rows in the order they were first measured.
var results struct {
	mu   sync.Mutex
	rows []*row
}

func record(nodes, clients int, impl string, r result) {
	results.mu.Lock()
	defer results.mu.Unlock()
	k := rowKey{nodes, clients}
	var rw *row
	for _, x := range results.rows {
		if x.rowKey == k {
			rw = x
		}
	}
	if rw == nil {
		rw = &row{rowKey: k}
		results.rows = append(results.rows, rw)
	}
	switch impl {
	case "lockproxy":
		rw.lockproxy = &r
	case "redsync":
		rw.redsync = &r
	default:
		panic("bench: unknown implementation " + impl)
	}
}

// printResults writes the comparison table and the CPU table as markdown.
func printResults(w io.Writer) {
	results.mu.Lock()
	defer results.mu.Unlock()
	if len(results.rows) == 0 {
		return
	}
	cell := func(r *result) string {
		if r == nil {
			return "– | – | –"
		}
		return fmt.Sprintf("%.0f | %.2f ms | %.2f ms", r.cyclesPerSec, ms(r.p50), ms(r.p99))
	}
	fmt.Fprintln(w, "\nLOCK+UNLOCK cycles, each client on its own key:")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| nodes | clients | lockproxy cycles/s | p50 | p99 | redsync cycles/s | p50 | p99 | ratio |")
	fmt.Fprintln(w, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, rw := range results.rows {
		ratio := "–"
		if rw.lockproxy != nil && rw.redsync != nil && rw.redsync.cyclesPerSec > 0 {
			ratio = fmt.Sprintf("%.2f", rw.lockproxy.cyclesPerSec/rw.redsync.cyclesPerSec)
		}
		fmt.Fprintf(w, "| %d | %d | %s | %s | %s |\n", rw.nodes, rw.clients, cell(rw.lockproxy), cell(rw.redsync), ratio)
	}

	if len(interleaved) > 0 {
		fmt.Fprintf(w, "\nlockproxy/redsync cycles/s in %d alternating rounds of %v (median, and the range):\n\n", interleavedRounds, roundLength)
		fmt.Fprintln(w, "| nodes | clients | median ratio | lowest | highest | steal |")
		fmt.Fprintln(w, "|---:|---:|---:|---:|---:|---:|")
		for _, rw := range results.rows {
			if rs := interleaved[rw.rowKey]; len(rs) > 0 {
				fmt.Fprintf(w, "| %d | %d | %.2f | %.2f | %.2f | %s |\n", rw.nodes, rw.clients, rs[len(rs)/2], rs[0], rs[len(rs)-1], stealCell(interleavedSteal[rw.rowKey]))
			}
		}
	}

	idle := func(r *result) string {
		if r == nil || !r.machine.ok {
			return "– | –"
		}
		return fmt.Sprintf("%.1f %% | %.1f %%", r.machine.idle, r.machine.steal)
	}
	fmt.Fprintln(w, "\nThe machine during each back-to-back run: idle CPU, and steal (CPU the host gave to others):")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| nodes | clients | lockproxy: idle | steal | redsync: idle | steal |")
	fmt.Fprintln(w, "|---:|---:|---:|---:|---:|---:|")
	for _, rw := range results.rows {
		fmt.Fprintf(w, "| %d | %d | %s | %s |\n", rw.nodes, rw.clients, idle(rw.lockproxy), idle(rw.redsync))
	}

	cpu := func(r *result, proxy bool) string {
		if r == nil {
			return "– | – | –"
		}
		p := "–"
		if proxy {
			p = fmt.Sprintf("%.0f", r.proxyCPU)
		}
		return fmt.Sprintf("%.0f | %s | %.0f", r.benchCPU, p, r.redisCPU)
	}
	fmt.Fprintln(w, "\nCPU µs per cycle (bench = client process; redis = all nodes):")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| nodes | clients | lockproxy: bench | proxy | redis | redsync: bench | proxy | redis |")
	fmt.Fprintln(w, "|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, rw := range results.rows {
		fmt.Fprintf(w, "| %d | %d | %s | %s |\n", rw.nodes, rw.clients, cpu(rw.lockproxy, true), cpu(rw.redsync, false))
	}
}

// stealCell is a steal percentage, or – where it was not measured.
func stealCell(m machineShare) string {
	if !m.ok {
		return "–"
	}
	return fmt.Sprintf("%.1f %%", m.steal)
}
