package fault

import (
	"math/rand/v2"
	"sort"
	"testing"
	"time"
)

// oracleCheck is the pairwise definition Check's sweep stands for, per
// grant in Check's order (by Enter, stable): b overlaps if an earlier grant
// it conflicts with (not both reads) ends after b entered, and the overlap
// involves a read if b is one or such a grant is; b is a late use if it
// overlaps none but such a grant exits after b entered; b regresses if it
// is a write whose fence is not above every earlier grant's, or a read
// whose fence is below an earlier write's.
func oracleCheck(grants []Grant) (overlaps, withRead, late, regress int) {
	byKey := map[string][]Grant{}
	for _, g := range grants {
		byKey[g.Key] = append(byKey[g.Key], g)
	}
	for _, gs := range byKey {
		sort.SliceStable(gs, func(i, j int) bool { return gs[i].Enter < gs[j].Enter })
		for j, b := range gs {
			ov, rd, lt, rg := false, false, false, false
			for _, a := range gs[:j] {
				if a.Shared && b.Shared {
					continue
				}
				if b.Enter < a.end() {
					ov = true
					rd = rd || a.Shared || b.Shared
				} else if b.Enter < a.exit() {
					lt = true
				}
				if !b.Shared && b.Fence <= a.Fence || b.Shared && !a.Shared && b.Fence < a.Fence {
					rg = true
				}
			}
			switch {
			case ov:
				overlaps++
				if rd {
					withRead++
				}
			case lt:
				late++
			}
			if rg {
				regress++
			}
		}
	}
	return
}

// Random small histories on two keys, with ties in Enter, reads, unknown
// exits and exits past the deadline: Check's counts must equal the
// pairwise oracle's.
func TestCheckMatchesPairwiseOracle(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	const histories = 50000
	at := func(n int) time.Duration { return time.Duration(n) * ms }
	for n := range histories {
		var gs []Grant
		for range 1 + rng.IntN(7) {
			enter := rng.IntN(20)
			length := 1 + rng.IntN(10)
			deadline := max(enter+length+rng.IntN(6)-3, enter+1)
			gr := Grant{Key: string(rune('a' + rng.IntN(2))), Fence: int64(1 + rng.IntN(5)), Shared: rng.IntN(3) == 0,
				Client: "c", Enter: at(enter), Deadline: at(deadline), Exit: at(enter + length)}
			if rng.IntN(8) == 0 {
				gr.Exit = -1
			}
			gs = append(gs, gr)
		}
		r := Check(gs)
		ov, rd, lt, rg := oracleCheck(gs)
		if r.OverlapCount != ov || r.ReadOverlapCount != rd || r.LateUseCount != lt || r.FenceRegressionCount != rg {
			t.Fatalf("history %d %v:\nCheck = %v\noracle: %d overlaps (%d with a read), %d late uses, %d fence regressions", n, gs, r, ov, rd, lt, rg)
		}
	}
}
