package commands

import (
	"errors"
	"reflect"
	"testing"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/quorum"
)

// TestDecideExec: a lock-key transaction's EXEC answers nil when a
// majority of all nodes found a watched key changed, the commands' replies
// when a majority ran them (each agreed on by a majority, PTTL by its own
// rule), a majority's error reply, and otherwise the reason there is no
// majority, never a guess.
func TestDecideExec(t *testing.T) {
	ran := func(vs ...any) []any { return vs }
	for _, c := range []struct {
		name    string
		rs      []backends.NodeReply
		ttl     []bool
		want    any
		aborted bool
		wantErr string // "noquorum", "nomajority", "other" or ""
	}{
		{"all ran", replies(ran(int64(1)), ran(int64(1)), ran(int64(1))), []bool{false}, []any{int64(1)}, false, ""},
		{"two ran, one changed", replies(ran(int64(1)), nil, ran(int64(1))), []bool{false}, []any{int64(1)}, false, ""},
		{"two changed, one ran", replies(ran(int64(1)), nil, nil), []bool{false}, nil, true, ""},
		{"changed everywhere", replies(nil, nil, nil), []bool{false}, nil, true, ""},
		{"one down, two ran", replies(errDown, ran(int64(1)), ran(int64(1))), []bool{false}, []any{int64(1)}, false, ""},
		{"split with one down", replies(ran(int64(1)), nil, errDown), []bool{false}, nil, false, "nomajority"},
		{"majority down", replies(ran(int64(1)), errDown, errDown), []bool{false}, nil, false, "noquorum"},
		{"empty transaction", replies(ran(), ran(), nil), nil, []any{}, false, ""},
		{"pttl by its rule", replies(ran(int64(1), int64(20000)), ran(int64(1), int64(19990)), ran(int64(1), int64(10))), []bool{false, true},
			[]any{int64(1), int64(19990)}, false, ""},
		{"get nil inside", replies(ran(nil, int64(0)), ran(nil, int64(0)), nil), []bool{false, false}, []any{nil, int64(0)}, false, ""},
		{"error reply of a majority", replies(backends.ReplyError("ERR x"), backends.ReplyError("ERR x"), nil), []bool{false}, backends.ReplyError("ERR x"), false, ""},
		{"elements split", replies(ran(int64(1)), ran(int64(0)), nil), []bool{false}, nil, false, "nomajority"},
		{"wrong shape is no vote", replies(ran(int64(1), int64(1)), ran(int64(1)), nil), []bool{false}, nil, false, "nomajority"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, aborted, err := decideExec(c.rs, 3, c.ttl)
			var nm *noMajorityError
			var nq *quorum.NoQuorumError
			switch c.wantErr {
			case "nomajority":
				if !errors.As(err, &nm) {
					t.Fatalf("err = %v; want no majority", err)
				}
				return
			case "noquorum":
				if !errors.As(err, &nq) {
					t.Fatalf("err = %v; want NOQUORUM", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("err = %v", err)
			}
			if aborted != c.aborted || !reflect.DeepEqual(got, c.want) {
				t.Errorf("got %#v, aborted %v; want %#v, aborted %v", got, aborted, c.want, c.aborted)
			}
		})
	}
}
