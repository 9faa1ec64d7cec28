package redis

import (
	"bufio"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// A node restarted without persistence has forgotten the lock keys it
// granted and its fence counters. If it voted at once, a second holder
// could win a majority that includes it while the first holder's lease
// still runs (A held nodes {1,2,3}; node 3 restarts empty; B gets
// {3,4,5}), and fences could go backwards. RedLock's answer is a delayed
// restart: the node stays out for longer than the longest lease. health
// tracks that per node: it learns the server's run_id from INFO server
// (on every new connection and periodically), and a changed run_id puts
// the node in quarantine for the quarantine period. While quarantined the
// node counts neither for nor against a quorum; when the period is over,
// its fence counters are re-seeded from the other nodes and it votes again.
//
// A node made a replica (REPLICAOF: a failover gone wrong, a Sentinel
// pointed at the lock nodes) still answers, but grants nothing: a
// read-only replica refuses every lock write with READONLY, and what a
// writable one accepts is replaced at its master's next full sync. It
// must not vote, nor count as ready. health learns the role from INFO
// replication at each periodic check. Once the node is a master again its
// data may be its old master's instead of its own — the locks it granted
// lost, as in a restart — so it is quarantined like a restarted node. A
// replica and back between two checks shows as a new replication ID with
// the old one kept as the secondary (master_replid2), which only a
// promotion sets: that is quarantined too.
//
// A node's data can also be replaced with no new run_id and no closed
// connection: a full sync (a replica and back, a writable replica),
// FLUSHALL, a restart behind a TCP proxy that kept the connection. So
// every node holds a data epoch, a random value under the lock prefix
// that the first writer connection of any lockproxy creates (SET NX) and
// every one reads at its set-up; every batch reads it again after its
// commands, and so does each check. Another value or none quarantines the
// node as a restart does (observeEpoch), and the batch's answers are no
// votes (Node.send, Node.exec).

// Node states as INFO shows them.
const (
	stateOK          = "ok"
	stateQuarantined = "quarantined"
	stateClock       = "clock"
	stateReplica     = "replica"
	stateDown        = "down"
)

// Reasons a node may not vote, as bits of health.blocked.
const (
	// blockRestart: the node restarted and waits for its quarantine
	// period and re-seed.
	blockRestart uint32 = 1 << iota
	// blockClock: the node's clock rate error is out of bound.
	blockClock
	// blockReplica: the last INFO replication said role:slave. It ends
	// only when the node is seen a master again, which quarantines it
	// (blockRestart) before this bit is cleared.
	blockReplica
)

// uptimeSlack absorbs the whole seconds of uptime_in_seconds and the time
// between the server reading its clock and ours.
const uptimeSlack = 2 * time.Second

// health is one node's restart detector and quarantine state. Its methods
// do no I/O and hold its mutex only briefly.
type health struct {
	now func() time.Time
	// period is how long a restarted node stays out; 0 disables the
	// quarantine (restarts are still counted).
	period time.Duration

	// blocked is read on every operation: blockRestart from a detected
	// restart (or promotion from replica) until the node is re-seeded,
	// blockClock while the node's clock rate error is out of bound,
	// blockReplica while the node is a replica.
	blocked atomic.Uint32
	// gen counts the restarts seen; the writer compares it around a batch.
	gen atomic.Uint64

	mu      sync.Mutex
	seen    bool
	runID   string
	boot    time.Time // the server's start, estimated from its uptime
	until   time.Time // end of the quarantine period
	down    bool
	reached bool   // the node answered at least once
	restart uint64 // restarts seen

	// From INFO replication (observeRole).
	replica bool   // the last role seen was a replica
	replID  string // master_replid last seen while a master; "" unknown

	// The node's data epoch (observeEpoch): the value of its epoch key
	// last seen, when hasEpoch. epochSeq counts the changes of the two,
	// so that a health check compares only with the epoch known when its
	// read began (see epochSince).
	epoch    string
	hasEpoch bool
	epochSeq uint64

	// noRoleLog says once that INFO replication cannot be read.
	noRoleLog sync.Once
}

func newHealth(period time.Duration, now func() time.Time) *health {
	if now == nil {
		now = time.Now
	}
	return &health{now: now, period: period}
}

// serverInfo is what INFO server tells about a node's identity.
type serverInfo struct {
	runID  string
	uptime time.Duration
	// hasUptime is false when uptime_in_seconds was missing.
	hasUptime bool
}

// parseServerInfo reads run_id and uptime_in_seconds from an INFO reply.
func parseServerInfo(s string) serverInfo {
	var si serverInfo
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		k, v, ok := strings.Cut(strings.TrimSpace(sc.Text()), ":")
		if !ok {
			continue
		}
		switch k {
		case "run_id":
			si.runID = v
		case "uptime_in_seconds":
			if n, err := strconv.ParseInt(v, 10, 64); err == nil && n >= 0 {
				si.uptime, si.hasUptime = time.Duration(n)*time.Second, true
			}
		}
	}
	return si
}

// replInfo is what INFO replication tells about a node's role.
type replInfo struct {
	role string // "master", "slave", or "" when missing
	// replID and replID2 are master_replid and master_replid2 (Redis 4
	// and later); a replica's replID is its master's.
	replID, replID2 string
	master          string // a replica's master_host:master_port
}

// noReplID is master_replid2 when the server has no secondary ID.
const noReplID = "0000000000000000000000000000000000000000"

// parseReplInfo reads the role and replication IDs from an INFO reply.
func parseReplInfo(s string) replInfo {
	var ri replInfo
	var host, port string
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		k, v, ok := strings.Cut(strings.TrimSpace(sc.Text()), ":")
		if !ok {
			continue
		}
		switch k {
		case "role":
			ri.role = v
		case "master_replid":
			ri.replID = v
		case "master_replid2":
			ri.replID2 = v
		case "master_host":
			host = v
		case "master_port":
			port = v
		}
	}
	if host != "" {
		ri.master = host + ":" + port
	}
	return ri
}

// Role changes observeRole reports.
type roleChange uint8

const (
	roleSame     roleChange = iota
	roleReplica             // now a replica: it stopped voting
	rolePromoted            // a master after being a replica: quarantined
)

// observeRole records one INFO replication answer. A replica stops voting
// at once. A master that was a replica, at the last answer or between the
// two (its replication ID changed, the old one kept as master_replid2,
// which only a promotion does; a master's ID also changes when its first
// replica attaches or its backlog expires, but those clear
// master_replid2), may hold another server's data instead of the locks it
// granted: it is quarantined as after a restart, with the same period and
// re-seed, and its restarts are not counted. The first answer about a
// master is never a promotion, as a first run_id is never a restart. An
// answer without a role changes nothing.
func (h *health) observeRole(ri replInfo) roleChange {
	if ri.role != "master" && ri.role != "slave" {
		return roleSame
	}
	now := h.now()
	h.mu.Lock()
	defer h.mu.Unlock()
	if ri.role == "slave" {
		h.replID = "" // its master's; a promotion is seen by the role
		if h.replica {
			return roleSame
		}
		h.replica = true
		h.blocked.Or(blockReplica)
		return roleReplica
	}
	promoted := h.replica ||
		h.replID != "" && ri.replID != "" && ri.replID != h.replID && ri.replID2 != "" && ri.replID2 != noReplID
	h.replica = false
	h.replID = ri.replID
	if !promoted {
		return roleSame
	}
	h.quarantineLocked(now)
	// Cleared after the quarantine is set: the node never votes in
	// between.
	h.blocked.And(^blockReplica)
	return rolePromoted
}

// observe records one INFO server answer and reports whether it shows a
// restart since the last one. The first answer is never a restart: the
// proxy may start long after its nodes. A restart is a new run_id or, when
// the server gives none, a start time later than the one estimated before.
func (h *health) observe(si serverInfo) bool {
	now := h.now()
	h.mu.Lock()
	defer h.mu.Unlock()
	h.down, h.reached = false, true
	var boot time.Time
	if si.hasUptime {
		boot = now.Add(-si.uptime)
	}
	if !h.seen {
		h.seen, h.runID, h.boot = true, si.runID, boot
		return false
	}
	restarted := false
	switch {
	case si.runID != "" && h.runID != "":
		restarted = si.runID != h.runID
	case si.hasUptime && !h.boot.IsZero():
		restarted = boot.Sub(h.boot) > uptimeSlack
	}
	if si.runID != "" {
		h.runID = si.runID
	}
	if !boot.IsZero() && (restarted || h.boot.IsZero()) {
		h.boot = boot
	}
	if !restarted {
		return false
	}
	h.restart++
	h.quarantineLocked(now)
	return true
}

// quarantineLocked starts a quarantine period at now, as after a restart
// (a promotion from replica and a data epoch change too). The node's
// data epoch is forgotten: the next one seen is the new data's, not a
// change (see observeEpoch). h.mu is held.
func (h *health) quarantineLocked(now time.Time) {
	if h.period > 0 {
		h.until = now.Add(h.period)
		h.blocked.Or(blockRestart)
	}
	h.epoch, h.hasEpoch = "", false
	h.epochSeq++
	// After the block: a batch that sees the new generation sees the
	// block too (Node.exec).
	h.gen.Add(1)
}

// epochSince is the count of the data epoch's changes, for a health
// check to take before its read (checkEpoch).
func (h *health) epochSince() uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.epochSeq
}

// observeEpoch records the node's data epoch as a connection read it
// (ok false: the key absent, or the read refused) and reports whether it
// changed: the data the node's votes stood on was replaced (a full sync
// from another master, FLUSHALL, a restart behind a proxy that kept the
// connection) without a new run_id. That quarantines the node as a
// restart does, without counting one. The first epoch seen, and the
// first after a quarantine started, are never a change: they are the
// data's as it is now, which the quarantine covers.
func (h *health) observeEpoch(v string, ok bool) bool {
	return h.observeEpochAt(v, ok, nil, 0)
}

// checkEpoch is observeEpoch for a health check's read, begun at
// generation gen with the epoch's change count seq (epochSince): it only
// compares, adopting nothing, and says nothing when the epoch known
// changed since the read began: a quarantine started (the value may be
// from before it), or a connection's set-up created the key and adopted
// it after this read found it absent (TestEpochCheckRacingFirstConnect).
func (h *health) checkEpoch(v string, ok bool, gen, seq uint64) bool {
	return h.observeEpochAt(v, ok, &gen, seq)
}

func (h *health) observeEpochAt(v string, ok bool, gen *uint64, seq uint64) bool {
	now := h.now()
	h.mu.Lock()
	defer h.mu.Unlock()
	if gen != nil && (!h.hasEpoch || h.gen.Load() != *gen || h.epochSeq != seq) {
		return false
	}
	if !h.hasEpoch {
		h.epoch, h.hasEpoch = v, ok
		h.epochSeq++
		return false
	}
	if ok && v == h.epoch {
		return false
	}
	h.quarantineLocked(now)
	h.epoch, h.hasEpoch = v, ok
	h.epochSeq++
	return true
}

// setDown records whether the last check reached the node.
func (h *health) setDown(down bool) {
	h.mu.Lock()
	h.down = down
	h.reached = h.reached || !down
	h.mu.Unlock()
}

// reachable reports whether the last check reached the node.
func (h *health) reachable() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.reached && !h.down
}

// quarantined reports whether the node must not vote, for whichever
// reason. It is one atomic load: it runs on every operation.
func (h *health) quarantined() bool { return h.blocked.Load() != 0 }

// refuse is the error a vote on the node gets without any I/O, or nil when
// the node may vote. It is one atomic load: it runs on every operation.
func (h *health) refuse() error {
	switch b := h.blocked.Load(); {
	case b == 0:
		return nil
	case b&blockReplica != 0:
		// First: a replica stays out until it is a master again, which
		// starts a new quarantine, whatever time its last one has left.
		return errReplica
	case b&blockRestart != 0:
		return errQuarantined
	default:
		return errClock
	}
}

// restarting reports whether the node is out because it restarted (its
// lock keys and fence counters may be lost), as opposed to its clock.
func (h *health) restarting() bool { return h.blocked.Load()&blockRestart != 0 }

// isReplica reports whether the last INFO replication said role:slave.
func (h *health) isReplica() bool { return h.blocked.Load()&blockReplica != 0 }

// stateLost reports whether the node's lock keys and fence counters are
// not its own now: it restarted (or was promoted) and waits for its
// re-seed, or it is a replica, whose data is its master's copy. Such a
// node is no source for re-seeding another.
func (h *health) stateLost() bool { return h.blocked.Load()&(blockRestart|blockReplica) != 0 }

// setClockOut takes the node out of (or back into) every quorum for its
// clock and reports whether that changed anything.
func (h *health) setClockOut(out bool) bool {
	if out {
		return h.blocked.Or(blockClock)&blockClock == 0
	}
	return h.blocked.And(^blockClock)&blockClock != 0
}

// seedDue reports whether the quarantine period is over and the node
// waits only for its fence counters to be re-seeded. Never while it is a
// replica: it refuses the writes, and its promotion starts a new period.
func (h *health) seedDue() bool {
	if !h.restarting() || h.isReplica() {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return !h.now().Before(h.until)
}

// seeded ends the quarantine after a re-seed, unless another restart
// started a new period meanwhile (then the seed is stale and is redone).
func (h *health) seeded() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.now().Before(h.until) {
		return false
	}
	h.blocked.And(^blockRestart)
	return true
}

// left is the time left in the quarantine period; 0 when the node only
// waits for its re-seed or is not quarantined.
func (h *health) left() time.Duration {
	if !h.restarting() {
		return 0
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if d := h.until.Sub(h.now()); d > 0 {
		return d
	}
	return 0
}

// status is the node's state for INFO.
func (h *health) status() (state string, left time.Duration, restarts uint64) {
	left = h.left()
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case h.isReplica():
		// Before the quarantine: see refuse.
		state = stateReplica
	case h.restarting():
		state = stateQuarantined
	case h.quarantined():
		state = stateClock
	case h.down || !h.reached:
		state = stateDown
	default:
		state = stateOK
	}
	return state, left, h.restart
}

// mergeFences is the per-field maximum of fence hashes as HGETALL returns
// them. Fields whose value is not a counter are skipped: they were not
// written by lockproxy.
func mergeFences(hashes []map[string]string) map[string]uint64 {
	out := make(map[string]uint64)
	for _, h := range hashes {
		for f, v := range h {
			n, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				continue
			}
			if n > out[f] {
				out[f] = n
			}
		}
	}
	return out
}
