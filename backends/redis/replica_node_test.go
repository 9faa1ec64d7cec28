package redis

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/quorum"
	"github.com/lockproxy/lockproxy/test/harness"
)

// A node turned into a replica (REPLICAOF: a failover gone wrong, a
// misconfigured Sentinel) still answers PING, but grants nothing: a
// read-only replica refuses every lock write with READONLY, and a writable
// one (replica-read-only no) keeps what it is sent only until its master's
// next full sync replaces its data. So it must not vote, and /readyz and
// lockproxy_node_voting must say so (README: "/readyz answers 200 only when
// a lock can be granted"). Once it is a master again its data may be its
// old master's, not its own, which loses locks as a restart does: it stays
// out for the quarantine period, like a restarted node.

// replicaOf makes r a replica of master's redis-server, or a master again
// when master is nil.
func replicaOf(t *testing.T, r, master *harness.Redis) {
	t.Helper()
	args := []any{"REPLICAOF", "NO", "ONE"}
	if master != nil {
		host, port, err := net.SplitHostPort(master.Addr)
		if err != nil {
			t.Fatal(err)
		}
		args = []any{"REPLICAOF", host, port}
	}
	if err := r.Client(t).Do(ctxTimeout(t, 5*time.Second), args...).Err(); err != nil {
		t.Fatalf("%v on %s: %v", args, r.Addr, err)
	}
}

// nodeGauges reads the gauge name per node from the backend's state
// collector, as a scrape does.
func nodeGauges(t *testing.T, b *Backend, name string) map[string]float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(b.StateCollector())
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "node" {
					out[l.GetValue()] = m.GetGauge().GetValue()
				}
			}
		}
	}
	return out
}

// readyFailures runs Ready and returns the reason of each node's failure,
// by node index; it fails the test when Ready succeeds.
func readyFailures(t *testing.T, b *Backend) map[int]string {
	t.Helper()
	err := b.Ready(ctxTimeout(t, 5*time.Second))
	var nq *quorum.NoQuorumError
	if !errors.As(err, &nq) {
		t.Fatalf("Ready = %v; want a *quorum.NoQuorumError", err)
	}
	out := map[int]string{}
	for _, f := range nq.Failures {
		for i, n := range b.nodes {
			if n.Name() == f.Node {
				out[i] = quorum.Reason(f.Err)
			}
		}
	}
	return out
}

// TestReplicaNodeDoesNotVote turns two of three real redis-servers into
// replicas of the third, then back into masters.
func TestReplicaNodeDoesNotVote(t *testing.T) {
	tests := []struct {
		name string
		// writable sets replica-read-only no: the replica's writes
		// succeed, and are lost at its master's next full sync.
		writable bool
	}{
		{name: "read-only replicas"},
		{name: "writable replicas", writable: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			core, logs := observer.New(zap.InfoLevel)
			b, rs := newRealBackend(t, 3, func(cfg *Config) {
				cfg.Quarantine, cfg.MaxTTL, cfg.CheckInterval, cfg.Logger = true, time.Hour, 50*time.Millisecond, zap.New(core)
			})
			ctx := ctxTimeout(t, 20*time.Second)
			if err := b.Ready(ctx); err != nil {
				t.Fatalf("Ready before any replica = %v; want nil", err)
			}
			for _, i := range []int{1, 2} {
				if tt.writable {
					if err := rs[i].Client(t).ConfigSet(ctx, "replica-read-only", "no").Err(); err != nil {
						t.Fatal(err)
					}
				}
				replicaOf(t, rs[i], rs[0])
			}

			// At once, without waiting for a health check: Ready asks.
			want := map[int]string{1: "replica", 2: "replica"}
			if got := readyFailures(t, b); !equalReasons(got, want) {
				t.Errorf("Ready's failures right after REPLICAOF = %v; want %v", got, want)
			}
			for _, i := range []int{1, 2} {
				n := b.nodes[i]
				waitFor(t, n.Name()+": seen as a replica", func() bool {
					return strings.Contains(b.NodeStates()[i], ",state=replica,")
				})
			}
			votes, replicas := nodeGauges(t, b, "lockproxy_node_voting"), nodeGauges(t, b, "lockproxy_node_replica")
			for i, n := range b.nodes {
				if want := map[bool]float64{true: 1, false: 0}[i == 0]; votes[n.Name()] != want || replicas[n.Name()] != 1-want {
					t.Errorf("node %d: lockproxy_node_voting %v, lockproxy_node_replica %v; want %v, %v",
						i, votes[n.Name()], replicas[n.Name()], want, 1-want)
				}
			}
			_, err := b.Lock(ctx, backends.LockRequest{Key: "ro", Token: "A", TTL: 5 * time.Second})
			if !errors.Is(err, quorum.ErrNoQuorum) {
				t.Errorf("LOCK with two replicas = %v; want no quorum", err)
			}

			// Masters again: their data may be their master's, so they
			// stay out for the quarantine period, without counting as
			// restarts.
			for _, i := range []int{1, 2} {
				replicaOf(t, rs[i], nil)
			}
			for _, i := range []int{1, 2} {
				waitFor(t, b.nodes[i].Name()+": quarantined once a master", func() bool {
					return strings.Contains(b.NodeStates()[i], ",state=quarantined,")
				})
				if st := b.NodeStates()[i]; !strings.Contains(st, ",restarts=0,") {
					t.Errorf("node %d after its promotion: %s; want restarts=0", i, st)
				}
			}
			want = map[int]string{1: "quarantined", 2: "quarantined"}
			if got := readyFailures(t, b); !equalReasons(got, want) {
				t.Errorf("Ready's failures after the promotions = %v; want %v", got, want)
			}
			_, err = b.Lock(ctx, backends.LockRequest{Key: "ro", Token: "A", TTL: 5 * time.Second})
			if !errors.Is(err, quorum.ErrNoQuorum) {
				t.Errorf("LOCK with two nodes just promoted = %v; want no quorum", err)
			}
			// The logs say why, once per change and node.
			for _, msg := range []string{"redis node is a replica", "redis node is a master again after being a replica"} {
				got := logs.FilterMessageSnippet(msg).FilterLevelExact(zap.WarnLevel).Len()
				if got != 2 {
					t.Errorf("%d warnings %q; want one per node made a replica", got, msg)
				}
			}
		})
	}
}

func equalReasons(got, want map[int]string) bool {
	if len(got) != len(want) {
		return false
	}
	for i, r := range want {
		if got[i] != r {
			return false
		}
	}
	return true
}

// TestReplicaTransitionsBetweenChecks drives one node's health check by
// hand around changes of its role, some made between two checks, where
// only the replication ID can tell: a node that became a replica and a
// master again between checks (its data replaced by a full sync, or not)
// is quarantined, while a master whose replication ID changed because a
// replica attached to it keeps voting.
func TestReplicaTransitionsBetweenChecks(t *testing.T) {
	type step int
	const (
		check    step = iota // run the node's health check
		toMaster             // REPLICAOF NO ONE on the node
		toRepl               // REPLICAOF the other server on the node
		attach               // the other server becomes the node's replica
	)
	tests := []struct {
		name  string
		steps []step
		want  string // the node's state after the steps
	}{
		{name: "master throughout", steps: []step{check, check}, want: stateOK},
		{name: "replica and back between checks", steps: []step{check, toRepl, toMaster, check}, want: stateQuarantined},
		{name: "replica seen, then master", steps: []step{check, toRepl, check, toMaster, check}, want: stateQuarantined},
		{name: "replica at the first check", steps: []step{toRepl, check, check}, want: "replica"},
		{name: "replica at the first check, then master", steps: []step{toRepl, check, toMaster, check}, want: stateQuarantined},
		{name: "a replica attaches to it", steps: []step{check, attach, check, check}, want: stateOK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			harness.RequireBinary(t, "redis-server", "redis-server")
			rs := harness.StartRedisN(t, 2, harness.RedisOptions{})
			n := NewNode(NodeConfig{Addr: rs[0].Addr, KeyPrefix: "lp:", Timeout: time.Second, Quarantine: time.Hour})
			t.Cleanup(func() { n.Close() })
			for _, s := range tt.steps {
				switch s {
				case check:
					ctx, cancel := context.WithTimeout(context.Background(), checkTimeout)
					n.check(ctx)
					cancel()
				case toMaster:
					replicaOf(t, rs[0], nil)
				case toRepl:
					replicaOf(t, rs[0], rs[1])
				case attach:
					replicaOf(t, rs[1], rs[0])
					// The master changes its replication ID when the
					// replica's sync reaches it.
					waitFor(t, "the replica's sync request", func() bool {
						info := rs[0].Client(t).Info(context.Background(), "replication").Val()
						return strings.Contains(info, "connected_slaves:1")
					})
				}
			}
			if st, _, restarts := n.State(); st != tt.want || restarts != 0 {
				t.Errorf("state after %v = %s, %d restarts; want %s, 0 restarts", tt.steps, st, restarts, tt.want)
			}
		})
	}
}

// TestObserveRole runs the role detector over sequences of INFO
// replication answers: when a node stops voting, when it is quarantined,
// and which changes of the replication ID are no promotion (a master's ID
// changes when its first replica attaches and when its backlog expires,
// both clearing master_replid2).
func TestObserveRole(t *testing.T) {
	master := func(id, id2 string) replInfo { return replInfo{role: "master", replID: id, replID2: id2} }
	slave := func(id string) replInfo { return replInfo{role: "slave", replID: id, master: "10.0.0.1:6379"} }
	type obs struct {
		ri        replInfo
		want      roleChange
		wantState string
		wantErr   error // refuse() after it
	}
	tests := []struct {
		name   string
		period time.Duration
		seq    []obs
	}{
		{name: "master throughout", period: time.Hour, seq: []obs{
			{master("A", noReplID), roleSame, stateOK, nil},
			{master("A", noReplID), roleSame, stateOK, nil},
		}},
		{name: "replica, then master: quarantined", period: time.Hour, seq: []obs{
			{master("A", noReplID), roleSame, stateOK, nil},
			{slave("M"), roleReplica, stateReplica, errReplica},
			{slave("M"), roleSame, stateReplica, errReplica},
			{master("B", "M"), rolePromoted, stateQuarantined, errQuarantined},
			{master("B", "M"), roleSame, stateQuarantined, errQuarantined},
		}},
		{name: "replica at the first answer", period: time.Hour, seq: []obs{
			{slave("M"), roleReplica, stateReplica, errReplica},
			{master("B", "M"), rolePromoted, stateQuarantined, errQuarantined},
		}},
		{name: "replica and back between answers", period: time.Hour, seq: []obs{
			{master("A", noReplID), roleSame, stateOK, nil},
			{master("B", "M"), rolePromoted, stateQuarantined, errQuarantined},
		}},
		{name: "replica between answers without a sync", period: time.Hour, seq: []obs{
			{master("A", noReplID), roleSame, stateOK, nil},
			{master("B", "A"), rolePromoted, stateQuarantined, errQuarantined},
		}},
		{name: "first replica attaches or backlog expires", period: time.Hour, seq: []obs{
			{master("A", noReplID), roleSame, stateOK, nil},
			{master("B", noReplID), roleSame, stateOK, nil},
			{master("C", ""), roleSame, stateOK, nil},
		}},
		{name: "first answer of a master promoted long ago", period: time.Hour, seq: []obs{
			{master("B", "M"), roleSame, stateOK, nil},
			{master("B", "M"), roleSame, stateOK, nil},
		}},
		{name: "no role: nothing changes", period: time.Hour, seq: []obs{
			{slave("M"), roleReplica, stateReplica, errReplica},
			{replInfo{}, roleSame, stateReplica, errReplica},
			{master("B", "M"), rolePromoted, stateQuarantined, errQuarantined},
		}},
		{name: "no replication IDs (Redis 3)", period: time.Hour, seq: []obs{
			{replInfo{role: "master"}, roleSame, stateOK, nil},
			{replInfo{role: "slave"}, roleReplica, stateReplica, errReplica},
			{replInfo{role: "master"}, rolePromoted, stateQuarantined, errQuarantined},
		}},
		{name: "quarantine off: votes once a master", period: 0, seq: []obs{
			{slave("M"), roleReplica, stateReplica, errReplica},
			{master("B", "M"), rolePromoted, stateOK, nil},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			now := time.Unix(1000, 0)
			h := newHealth(tt.period, func() time.Time { return now })
			h.setDown(false)
			for i, o := range tt.seq {
				gen := h.gen.Load()
				got := h.observeRole(o.ri)
				st, left, restarts := h.status()
				if got != o.want || st != o.wantState || !errors.Is(h.refuse(), o.wantErr) {
					t.Fatalf("answer %d %+v: change %d, state %s, refuse %v; want %d, %s, %v",
						i, o.ri, got, st, h.refuse(), o.want, o.wantState, o.wantErr)
				}
				if restarts != 0 {
					t.Errorf("answer %d: %d restarts counted; want 0 (a promotion is no restart)", i, restarts)
				}
				if got == rolePromoted {
					if h.gen.Load() == gen {
						t.Errorf("answer %d: promotion left the generation unchanged: a batch under way would count", i)
					}
					if tt.period > 0 && left != tt.period {
						t.Errorf("answer %d: quarantine left %v; want the whole period %v", i, left, tt.period)
					}
				}
			}
		})
	}
}

// TestReplicaNeverReseeded: a quarantined node that is a replica is not
// re-seeded when its period ends (it would refuse the writes) and says it
// is a replica; its promotion starts a new period. A replica is no source
// for re-seeding another node: its counters are its master's copy.
func TestReplicaNeverReseeded(t *testing.T) {
	now := time.Unix(1000, 0)
	h := newHealth(time.Minute, func() time.Time { return now })
	h.observe(serverInfo{runID: "a"})
	h.observe(serverInfo{runID: "b"})
	h.observeRole(replInfo{role: "slave"})
	now = now.Add(2 * time.Minute)
	if h.seedDue() {
		t.Error("seedDue of a quarantined replica after its period = true; want false")
	}
	if !h.stateLost() {
		t.Error("stateLost of a quarantined replica = false; want true")
	}
	// Its reason is the role: the quarantine starts anew at its promotion.
	if st, _, _ := h.status(); st != stateReplica || !errors.Is(h.refuse(), errReplica) {
		t.Errorf("a quarantined replica: state %s, refuse %v; want %s, %v", st, h.refuse(), stateReplica, errReplica)
	}
	if h.observeRole(replInfo{role: "master"}) != rolePromoted || !errors.Is(h.refuse(), errQuarantined) || h.left() != time.Minute {
		t.Errorf("promoted: refuse %v, %v left; want %v, a whole new period", h.refuse(), h.left(), errQuarantined)
	}
	r := newHealth(time.Minute, func() time.Time { return now })
	r.observeRole(replInfo{role: "slave"})
	if !r.stateLost() {
		t.Error("stateLost of a replica = false; want true (it cannot stand for a node that kept the fences)")
	}
}
