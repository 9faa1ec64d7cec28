package zookeeper

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/lockproxy/lockproxy/backends"
)

// TestFormatSeqAsZooKeeper: sequence numbers are written as ZooKeeper's
// Java "%010d" writes them, negative ones (a wrapped counter) included,
// and parse back from exactly that.
func TestFormatSeqAsZooKeeper(t *testing.T) {
	for _, tc := range []struct {
		seq  int32
		want string
	}{
		{0, "0000000000"},
		{42, "0000000042"},
		{math.MaxInt32, "2147483647"},
		{-1, "-000000001"},
		{-5, "-000000005"},
		{-999999999, "-999999999"},
		{-1000000000, "-1000000000"},
		{math.MinInt32, "-2147483648"},
	} {
		if got := formatSeq(tc.seq); got != tc.want {
			t.Errorf("formatSeq(%d) = %q; want %q", tc.seq, got, tc.want)
		}
		// Go's %010d pads as Java's does.
		if got := fmt.Sprintf("%010d", tc.seq); got != tc.want {
			t.Errorf("Sprintf(%%010d, %d) = %q; want %q", tc.seq, got, tc.want)
		}
		name := childPrefix(kindWrite, tokenHash("t"), "0a0b0c0d") + tc.want
		c, ok := parseChild(name)
		if !ok || c.seq != tc.seq || c.kind != kindWrite || c.nonce != "0a0b0c0d" {
			t.Errorf("parseChild(%q) = %+v, %v; want seq %d", name, c, ok, tc.seq)
		}
	}
	for _, bad := range []string{"-5", "-00000005", "00000000042", "2147483648", "-2147483649", "+000000001", "--00000001"} {
		name := childPrefix(kindWrite, "h", "n") + bad
		if c, ok := parseChild(name); ok {
			t.Errorf("parseChild(%q) = %+v; want rejected", name, c)
		}
	}
}

// TestOrderChildrenAcrossWrap: lock nodes come out in the order they were
// made, also when the key directory's child counter wrapped between them
// (past 2147483647, or past -1), whatever order the names are read in; a
// span of half the counter's circle or more is refused, never guessed.
// Before, a node with a negative sequence number (its name has a fourth
// '-') was not a lock node at all: a holder made after the wrap was
// invisible to the nodes queued behind it, which took the key too.
func TestOrderChildrenAcrossWrap(t *testing.T) {
	for _, tc := range []struct {
		name string
		seqs []int32 // in the order they were made
		err  error
	}{
		{"one", []int32{7}, nil},
		{"no wrap", []int32{3, 5, 9, 1000}, nil},
		{"past MaxInt32", []int32{math.MaxInt32 - 2, math.MaxInt32, math.MinInt32, math.MinInt32 + 4}, nil},
		{"past -1", []int32{-3, -1, 0, 2}, nil},
		{"spanning less than half the circle", []int32{math.MaxInt32 - 5, math.MinInt32 + 1<<30}, nil},
		{"spanning half the circle", []int32{0, math.MinInt32}, errUnordered},
		{"an old node alive through the wrap", []int32{10, 1 << 30, math.MinInt32 + 20}, errUnordered},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var kids []child
			for i, s := range tc.seqs {
				kids = append(kids, child{name: fmt.Sprintf("n%d", i), seq: s})
			}
			// Every rotation and the reverse of the order made, as a
			// read may list them.
			for r := range len(kids) {
				in := append(slices.Clone(kids[r:]), kids[:r]...)
				for _, rev := range []bool{false, true} {
					got := slices.Clone(in)
					if rev {
						slices.Reverse(got)
					}
					err := orderChildren(got)
					if !errors.Is(err, tc.err) {
						t.Fatalf("orderChildren(%v) error %v; want %v", in, err, tc.err)
					}
					if err == nil && !slices.Equal(got, kids) {
						t.Fatalf("orderChildren(%v) = %v; want %v", in, got, kids)
					}
				}
			}
		})
	}
}

// TestWrappedSequenceHolderBlocks runs the wrap on a real ZooKeeper. A
// directory's counter cannot be moved there short of two billion creates,
// so the nodes made "before" are made by hand, each under the name
// ZooKeeper gives a node when the counter has wrapped (a negative
// sequence number), in a holder instance's session, with the data and gate
// of a granted write node. The key directory's counter then gives a LOCK's
// node a sequence number just past zero, after those on the circle:
//   - a holder named "-000000002": a LOCK with another token is refused,
//     and granted once the holder's node goes. Before, the holder's name did
//     not parse as a lock node, and the LOCK was granted beside it;
//   - nodes spanning half the circle (one at 2^30, one at -2^30): the order
//     is unknown, and the LOCK fails without a grant and leaves no node.
func TestWrappedSequenceHolderBlocks(t *testing.T) {
	t.Parallel()
	root := testRoot(t)
	h := newBackend(t, []string{zkAddr}, root, 10*time.Second)
	a := newBackend(t, []string{zkAddr}, root, 10*time.Second)
	ctx := ctxT(t, 30*time.Second)
	// made makes a granted write node of token under key named with seq,
	// and its gate, in h's session.
	made := func(t *testing.T, key, token, seq string) string {
		t.Helper()
		dir := keyDir(root, key)
		if _, err := h.conn.Create(dir, nil, 0, h.acl); err != nil && !errors.Is(err, zk.ErrNodeExists) {
			t.Fatalf("create %s: %v", dir, err)
		}
		prefix := childPrefix(kindWrite, tokenHash(token), newNonce())
		d := lockData{write: 1, ttl: 30 * time.Second, startMS: time.Now().UnixMilli(), token: token, gated: true}
		path := dir + "/" + prefix + seq
		if _, err := h.conn.Multi(
			&zk.CreateRequest{Path: path, Data: d.encode(), Acl: h.acl, Flags: zk.FlagEphemeral},
			&zk.CreateRequest{Path: gatePath(root, dir, prefix), Acl: h.acl, Flags: zk.FlagEphemeral}); err != nil {
			t.Fatalf("create %s and its gate: %v", path, err)
		}
		return path
	}
	gone := func(t *testing.T, path string) {
		t.Helper()
		if err := h.remove(ctx, path, -1, true); err != nil {
			t.Fatalf("delete %s: %v", path, err)
		}
	}

	t.Run("holder made before the wrap's end", func(t *testing.T) {
		const key = "wrapped-holder"
		holder := made(t, key, "H", "-000000002")
		wantNotAcquired(t, a, key, "T", backends.Write)
		if info, ok, err := a.Info(ctx, key); err != nil || !ok || len(info.Holders) != 1 || info.Holders[0].Token != "H" {
			t.Errorf("LOCKINFO = %+v, %v, %v; want H holding", info, ok, err)
		}
		gone(t, holder)
		mustLock(t, a, key, "T", 30*time.Second, backends.Write)
	})

	t.Run("nodes spanning half the circle", func(t *testing.T) {
		const key = "wrapped-unordered"
		n1 := made(t, key, "H1", "1073741824")
		n2 := made(t, key, "H2", "-1073741824")
		l, err := lock(t, a, key, "T", 30*time.Second, 0, backends.Write)
		if !errors.Is(err, errUnordered) {
			t.Errorf("LOCK on a key whose nodes cannot be ordered = %+v, %v; want %v", l, err, errUnordered)
		}
		kids, _, err := h.conn.Children(keyDir(root, key))
		if err != nil || len(kids) != 2 {
			t.Errorf("children after the refused LOCK = %v, %v; want the two made by hand", kids, err)
		}
		gone(t, n1)
		gone(t, n2)
		mustLock(t, a, key, "T", 30*time.Second, backends.Write)
	})
}
