package conf

import (
	"errors"
	"strings"
	"testing"
)

// TestParseListsEveryProblemOnce: Parse lists the decoding problems and
// Validate's together, but not Validate's complaint about the default an
// undecodable key kept: "redlock.nodes: want a list" is the problem, not
// "at least one node is required" as well.
func TestParseListsEveryProblemOnce(t *testing.T) {
	p := writeFile(t, "c.yaml", "redlock:\n  nodes: {a: 1}\n  drift_factor: 0.7\n")
	_, err := Parse([]string{p}, []string{"LOCKPROXY_LOCKS_MAX_TTL=soon"})
	var ve *ValidationError
	if !errors.As(err, &ve) {
		t.Fatalf("Parse = %v; want a *ValidationError", err)
	}
	count := func(prefix string) int {
		n := 0
		for _, pr := range ve.Problems {
			if strings.HasPrefix(pr, prefix) {
				n++
			}
		}
		return n
	}
	for prefix, want := range map[string]int{
		"redlock.nodes: ": 1, "redlock.drift_factor: ": 1, "LOCKPROXY_LOCKS_MAX_TTL: ": 1, "locks.max_ttl: ": 0,
	} {
		if got := count(prefix); got != want {
			t.Errorf("problems %q: %d start with %q; want %d", ve.Problems, got, prefix, want)
		}
	}
}
