package redis

import (
	"bytes"
	"cmp"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/lockproxy/lockproxy/quorum"
)

// owed is what a writer still owes its node after it dropped a connection
// with acquires unanswered on it (a node timeout: a paused node, a slow
// link). Such an acquire may have run, may still be in the connection's
// socket buffers and run when the node gets to it, after its roll-back
// went out on another connection or could not go out at all (it would
// then keep its key for its whole TTL), or may never run. So the writer
// remembers
//
//   - the dropped connection's client id (a kill), only where nothing but
//     acquires, fence writes, extends and raises was unanswered on it (see
//     lost): a release or unmark left on it must run. Fence writes alone
//     are reason enough: one that runs after the hold's release (sent on
//     the next connection, which the node may serve first) stores a lockf
//     that outlives the hold for its whole lease;
//   - its unanswered acquires (doubts: exclusive ones, and read ones
//     marked with their attempt), killed or not, until
//     their roll-back (a failed attempt's release, never a holder's
//     UNLOCK: see settles) is written or owed;
//   - the roll-backs of doubts that could not be written at all (no
//     connection, see unsent): owed releases. A release written to a
//     connection is never sent again, answered or not: it may have run,
//     and run twice it takes another hold of its token (a reentrant
//     holder's last);
//   - its unanswered fence writes that store a lockf, within their lease:
//     owed sweeps. Where the connection is not killed (a release or
//     unmark was left on it, its id or server is not known, the kill is
//     refused), such a write may run after the hold's release, which the
//     next connection carried and the node served first, and its lockf,
//     naming a token that no longer holds the key, would stay for the
//     whole lease. Once the node no longer lists the connection (CLIENT
//     LIST ID, or another run_id: it restarted) nothing of it can run any
//     more, and the sweep (sweepFenceScript) deletes that write's lockf
//     unless its token holds the key. Until then the writer asks again at
//     its own pace (see owed.sweepAt), never holding a batch for it.
//
// and the first batch on its next connection starts with CLIENT KILL ID
// for each kill, then the owed releases, in the same write, ahead of
// everything else. Once the node has run the kill, the old connection can
// run nothing more. The roll-back of a doubt, owed or written later, goes
// out as lateGrantReleaseScript: it removes the token's hold only where
// the acquire made it (for a marked attempt, a LOCK with TOKEN: where
// lockm is still its mark; for an unmarked one: no stored fence, no extra
// holds), never a hold the token had before the acquire, which a plain
// release would take
// where the acquire found the key held by its own token (a reentrant
// LOCK: the acquire script is sent only once the SET's answer is read) or
// was killed before it ran. Everything sent on the new connection after
// the kills and owed releases reaches the node after them, so an owed
// release never undoes a later hold of the same token. When no batch
// comes, the writer connects and pays by itself (Node.payDebts).
//
// A kill is sent only to the server that ran the connection (same
// run_id): client ids start again after a restart. Where CLIENT ID or
// INFO is refused there is no kill, and the owed releases still go out
// on the next connection, which covers an acquire that ran before it.
//
// Every list keeps at most maxOwed entries (the oldest go), and an entry
// is forgotten once its acquire's TTL has passed since it was sent, or
// since the writer last failed to reach the node if that is later: an
// acquire cannot land while the node is out of reach, and once it lands
// its key lasts one TTL.
//
// A writer that never dropped a connection with an acquire or a fence
// write on it has no owed (nil), and its batches pay nothing for it.
type owed struct {
	kills []owedKill
	// fences are the fence writes a kill stopped: written again after
	// the kills (owedFenceScript), which stores the lockf only while the
	// token still holds the key and has none stored. Without it the hold
	// would have no lockf: LOCKINFO would show the slot counter, and a
	// reentrant grant would take the other nodes' fence or the counter.
	// (The roll-back of a later reentrant acquire in doubt no longer
	// depends on it: that acquire is marked, see op.attempt.) Each is owed
	// only until its acquire's start plus its TTL (see keepWithin).
	fences   []owedFence
	releases []owedRelease
	doubts   []owedAcquire
	// sweeps are the fence writes left on dropped connections, to be
	// undone once their connection is gone (see owedSweep). The checks
	// whether it is (CLIENT LIST ID), and the sweeps of those that cannot
	// be checked, go out no sooner than sweepAt, which sweepEvery paces
	// (doubled each time, from debtRetryMin to debtRetryMax): a
	// connection the node still lists may stay so for long (a link that
	// holds its bytes), and every batch need not ask.
	sweeps     []owedSweep
	sweepAt    time.Time
	sweepEvery time.Duration
	// down is the last time the writer failed to reach the node.
	down time.Time
	// inKills is how many of the first kills the connection's current
	// batch carries, their answers still to read; inReleases are the owed
	// releases it carries, no longer owed (written), their answers still
	// to read.
	inKills    int
	inFences   int
	inReleases []owedRelease
	// inSweeps is how many sweeps (those marked sent) the current batch
	// carries, and inCheck the client ids its CLIENT LIST ID asks about
	// (empty: none sent), their answers still to read.
	inSweeps int
	inCheck  []int64
	// retry paces the writer's own attempts to pay (see Node.payDebts).
	retry time.Duration
	timer *time.Timer
}

// maxOwed bounds each of owed's lists.
const maxOwed = 1024

// The pace of a writer's own attempts to pay what it owes, doubled after
// each failed one.
const (
	debtRetryMin = 50 * time.Millisecond
	debtRetryMax = time.Second
)

// owedTime is when an owed entry's acquire was sent and its TTL.
type owedTime struct {
	from time.Time
	ttl  time.Duration
}

func (t owedTime) when() owedTime { return t }

type owedKill struct {
	id  int64
	run string
	owedTime
}

type owedFence struct {
	base, token string
	fence       int64
	slot        uint16
	owedTime
}

type owedRelease struct {
	base, token string
	attempt     string // the acquire's mark, or "" (see op.attempt)
	mark        string // the mark its node stored for an unnamed one (see op.mark)
	read        bool   // a read acquire's (see lateReadReleaseScript)
	owedTime
}

type owedAcquire struct {
	base, token string
	attempt     string
	mark        string // see op.mark
	read        bool
	owedTime
}

// owedSweep is a fence write (SET lockf "fence,token" PX) left unanswered
// on a dropped connection, which may still run on the node.
type owedSweep struct {
	base, token string
	fence       int64
	// id and run are the dropped connection's client id and its server's
	// run_id: 0 and "" where not known (CLIENT ID or INFO refused), and
	// the connection can then not be asked about.
	id    int64
	run   string
	state sweepState
	// listed is when the node last listed the connection: its write may
	// still run until then, and its lockf lasts one lease from there
	// (see when).
	listed time.Time
	// sent marks a sweep the current batch carries (see owed.inSweeps).
	sent bool
	owedTime
}

type sweepState uint8

const (
	// sweepWatched: the connection may still run the write; the node is
	// asked whether it still lists it.
	sweepWatched sweepState = iota
	// sweepGone: the connection is gone, the write ran or never will:
	// swept once, with the next write.
	sweepGone
	// sweepBlind: the node cannot be asked (the connection's id or server
	// is not known, CLIENT LIST is refused): swept at the owed pace until
	// the write's lease ends, which bounds what it can leave.
	sweepBlind
)

// when extends the sweep's lease from the last time the node listed its
// connection: a write that runs later stores a lockf for one lease more.
func (s owedSweep) when() owedTime {
	t := s.owedTime
	if s.listed.After(t.from) {
		t.from = s.listed
	}
	return t
}

// live tells whether an entry still matters at now.
func (o *owed) live(t owedTime, now time.Time) bool {
	start := t.from
	if o.down.After(start) {
		start = o.down
	}
	return now.Before(start.Add(t.ttl))
}

// push appends v to s, dropping the oldest entry when s is full.
func push[T any](s []T, v T) []T {
	if len(s) >= maxOwed {
		s = s[:copy(s, s[len(s)-maxOwed+1:])]
	}
	return append(s, v)
}

// within tells whether now is before t's TTL has passed since t.from,
// however long the node was out of reach since.
func (t owedTime) within(now time.Time) bool { return now.Before(t.from.Add(t.ttl)) }

// keepWithin drops the entries of s whose TTL has passed since their
// from. The owed fence writes go by it: a fence write's hold cannot matter
// to its holder past its acquire's start plus its TTL (the holder's
// validity counts from before), and a token's later hold, made by a new
// acquire once that one ended, must not get its fence (the roll-back of
// that acquire, if it failed, would take it for one the token had before
// and leave it until its TTL).
func keepWithin[T interface{ when() owedTime }](s []T, now time.Time) []T {
	out := s[:0]
	for _, e := range s {
		if e.when().within(now) {
			out = append(out, e)
		}
	}
	clear(s[len(out):])
	return out
}

// keepLive drops the entries of s that no longer matter.
func keepLive[T interface{ when() owedTime }](o *owed, s []T, now time.Time) []T {
	out := s[:0]
	for _, e := range s {
		if o.live(e.when(), now) {
			out = append(out, e)
		}
	}
	clear(s[len(out):])
	return out
}

// prune forgets what no longer matters at now.
func (o *owed) prune(now time.Time) {
	o.kills = keepLive(o, o.kills, now)
	o.fences = keepWithin(o.fences, now)
	o.releases = keepLive(o, o.releases, now)
	o.doubts = keepLive(o, o.doubts, now)
	o.sweeps = keepLive(o, o.sweeps, now)
}

// empty tells whether nothing is owed or in doubt.
func (o *owed) empty() bool {
	return len(o.kills) == 0 && len(o.fences) == 0 && len(o.releases) == 0 && len(o.doubts) == 0 && len(o.sweeps) == 0
}

// due tells whether something is to be sent now.
func (o *owed) due() bool {
	return len(o.kills) > 0 || len(o.fences) > 0 || len(o.releases) > 0 || o.sweepsReady()
}

// sweepsReady tells whether a sweep's connection was found gone: it is
// swept with the next write.
func (o *owed) sweepsReady() bool {
	return slices.ContainsFunc(o.sweeps, func(s owedSweep) bool { return s.state == sweepGone })
}

// watching tells whether sweeps wait for their connection to go, or are
// made blind: something is to be sent at sweepAt.
func (o *owed) watching() bool {
	return slices.ContainsFunc(o.sweeps, func(s owedSweep) bool { return s.state != sweepGone })
}

// reading tells whether answers to debts written on the connection are
// still to be read.
func (o *owed) reading() bool {
	return o.inKills > 0 || o.inFences > 0 || len(o.inReleases) > 0 || o.inSweeps > 0 || len(o.inCheck) > 0
}

// settle removes the latest acquire in doubt of base by token in attempt
// ("" for an unmarked one) and returns it: its roll-back is owed, or was
// written. The roll-back of another attempt of the token never settles
// it: it would carry that attempt's mark and remove the hold the attempt
// in doubt made, which may be one its token holds (the attempt won its
// majority without this node's answer).
func (o *owed) settle(base, token, attempt string) (owedAcquire, bool) {
	for i := len(o.doubts) - 1; i >= 0; i-- {
		if d := o.doubts[i]; d.base == base && d.token == token && d.attempt == attempt {
			o.doubts = slices.Delete(o.doubts, i, i+1)
			return d, true
		}
	}
	return owedAcquire{}, false
}

func (o *owed) owe(d owedAcquire, t owedTime) {
	o.releases = push(o.releases, owedRelease{base: d.base, token: d.token, attempt: d.attempt, mark: d.mark, read: d.read, owedTime: t})
}

// lost records that the writer's connection (client id, on the server
// run) failed at now with unanswered (the batch's operations whose answer
// was not read) left on it.
//
// Whatever was written to it is never sent again, answered or not: it
// may have run, and a release that runs twice takes a hold it was not
// meant to (a reentrant holder's last). So the owed releases the
// connection carried are paid, and its own releases are not owed.
//
// Its unanswered acquires (exclusive ones, and read ones marked with their
// attempt) are kept in doubt whatever else it carried, so that their
// roll-backs go out as lateGrantReleaseScript (lateReadReleaseScript)
// and never take a hold their token had before. The connection is killed from the next one
// only when it carried no unanswered release, owed release or unmark:
// those must run (a user's UNLOCK killed would leave the key until its
// TTL, and cannot be sent again). Unanswered fence writes, extends and
// raises do not prevent it (their loss is a failure already). Without the
// kill an acquire in doubt may still land after its roll-back and keep
// its key until its TTL, as one could before kills.
//
// Each unanswered fence write that stores a lockf within its lease is
// owed a sweep (see owedSweep), killed or not: the kill may be refused.
// A killed one's sweep finds its connection gone at once and its lockf,
// if any, its hold's (written again by owedFenceScript), which it keeps.
func (o *owed) lost(unanswered []*op, fences unansweredFences, id int64, run string, now time.Time) {
	o.down = now
	o.inKills = 0  // not answered: sent again (a kill can run twice)
	o.inFences = 0 // likewise (they store nothing once the hold is gone)
	o.unsentSweeps()
	o.oweSweeps(fences, id, run, now)
	carried := len(o.inReleases) > 0
	clear(o.inReleases)
	o.inReleases = o.inReleases[:0] // written: never sent again
	kill := !carried && killable(unanswered, fences.killable())
	ttl := fences.ttl()
	for _, p := range unanswered {
		if lateGrantable(p) {
			t := time.Duration(p.ms) * time.Millisecond
			o.doubts = push(o.doubts, owedAcquire{base: p.base, token: p.token, attempt: p.attempt, mark: p.mark, read: p.mode == quorum.Shared, owedTime: owedTime{now, t}})
			ttl = max(ttl, t)
		}
	}
	if kill && id > 0 && run != "" {
		o.kills = push(o.kills, owedKill{id: id, run: run, owedTime: owedTime{now, ttl}})
		for _, f := range fences {
			t := owedTime{f.start, time.Duration(f.ms) * time.Millisecond}
			if !f.gone && t.within(now) {
				o.fences = push(o.fences, owedFence{base: f.base, token: f.token, fence: f.fence, slot: f.slot, owedTime: t})
			}
		}
	}
}

// oweSweeps records a sweep for each of fences that stores a lockf within
// its lease, left on the connection id of the server run (see owedSweep),
// and has the next write ask whether that connection is gone.
func (o *owed) oweSweeps(fences unansweredFences, id int64, run string, now time.Time) {
	state := sweepWatched
	if id <= 0 || run == "" {
		state = sweepBlind
	}
	added := false
	for _, f := range fences {
		t := owedTime{f.start, time.Duration(f.ms) * time.Millisecond}
		if f.gone || !t.within(now) {
			continue
		}
		o.sweeps = push(o.sweeps, owedSweep{base: f.base, token: f.token, fence: f.fence, id: id, run: run, state: state, owedTime: t})
		added = true
	}
	if added {
		o.sweepAt, o.sweepEvery = now, debtRetryMin
	}
}

// unsentSweeps forgets what the connection's batch carried of the sweeps
// and checks, their answers lost: a sweep can run twice, and a check is
// asked again.
func (o *owed) unsentSweeps() {
	for i := range o.sweeps {
		o.sweeps[i].sent = false
	}
	o.inSweeps = 0
	o.inCheck = o.inCheck[:0]
}

// lateGrantable tells whether p is an acquire kept in doubt when its
// answer is lost: an exclusive one, whose hold lateGrantReleaseScript
// knows (its SET NX's, or its mark), and a read one marked with its
// attempt, whose hold lateReadReleaseScript knows by the mark. (A read
// acquire without a mark, which the quorum never sends, is not: a plain
// release would have to roll it back, and owed after a kill that stopped
// it, it could take a read hold its token had before.)
func lateGrantable(p *op) bool {
	return p.kind == opAcquire && (p.mode != quorum.Shared || p.attempt != "")
}

// inDoubt tells whether unanswered holds an acquire kept in doubt (see
// owed.lost).
func inDoubt(unanswered []*op) bool {
	for _, p := range unanswered {
		if lateGrantable(p) {
			return true
		}
	}
	return false
}

// unansweredFences are the fence writes whose answers were not read on a
// dropped connection.
type unansweredFences []fenceWrite

// ttl is the longest lease among the writes that store a fence (0: none).
func (f unansweredFences) ttl() time.Duration {
	var d time.Duration
	for _, w := range f {
		if !w.gone {
			d = max(d, time.Duration(w.ms)*time.Millisecond)
		}
	}
	return d
}

// killable tells whether the fence writes are reason to kill their
// connection. A mark they clear must be cleared (it would keep readers
// queued until it ends), so they are not.
func (f unansweredFences) killable() bool {
	for _, w := range f {
		if w.mark {
			return false
		}
	}
	return f.ttl() > 0
}

// killable tells whether a connection dropped with unanswered left on it
// may be killed: an acquire kept in doubt among them (lateGrantable), or
// fence writes that are reason to (fences), and no release, unmark or
// unmarked read acquire (whose plain roll-back, after a kill that stopped
// it, would take a read hold its token had before).
func killable(unanswered []*op, fences bool) bool {
	acquire := fences
	for _, p := range unanswered {
		switch {
		case lateGrantable(p):
			acquire = true
		case p.kind == opRelease, p.kind == opUnmark, p.kind == opAcquire:
			return false
		}
	}
	return acquire
}

// settles tells whether p is the roll-back of an acquire that may be in
// doubt: a failed attempt's release (a read attempt's when it names the
// attempt, as the quorum's do: see lateReadReleaseScript). A holder's
// UNLOCK (one of its holds, whatever the doubt) stays a plain release.
func settles(p *op) bool {
	return p.kind == opRelease && p.rollback && (p.hold != quorum.ReadHold || p.attempt != "")
}

// unsent records a batch that could not be sent at now (no connection):
// its releases of acquires in doubt are owed, one per doubt.
func (o *owed) unsent(ops []*op, now time.Time) {
	o.down = now
	for _, p := range ops {
		if !settles(p) {
			continue
		}
		if d, ok := o.settle(p.base, p.token, p.attempt); ok {
			o.owe(d, owedTime{now, d.ttl})
		}
	}
}

// written records that ops are about to be written to a connection: a
// release of an acquire in doubt settles it, and goes out as its
// roll-back (lateGrantReleaseScript), never to be sent again.
func (o *owed) written(ops []*op) {
	for _, p := range ops {
		if settles(p) && !p.lateGrant {
			var d owedAcquire
			d, p.lateGrant = o.settle(p.base, p.token, p.attempt)
			p.lateMark = d.mark
		}
	}
}

// wait is the channel on which the writer's next own attempt to pay is
// due: after retry when something is due, else (sweeps watched or blind)
// no sooner than sweepAt.
func (o *owed) wait(now time.Time) <-chan time.Time {
	if o.retry == 0 {
		o.retry = debtRetryMin
	}
	d := o.retry
	if !o.due() {
		d = max(d, o.sweepAt.Sub(now))
	}
	if o.timer == nil {
		o.timer = time.NewTimer(d)
	} else {
		o.timer.Reset(d)
	}
	return o.timer.C
}

func (o *owed) stop() {
	if o.timer != nil {
		o.timer.Stop()
	}
}

// writeDebts adds what w owes to c's batch, ahead of anything else: the
// kills of connections of the server c is on, then the owed releases.
func (n *Node) writeDebts(c *nodeConn, o *owed, now time.Time) {
	o.prune(now)
	// Kills for another server (it restarted) or one not known are
	// dropped: that connection is gone, and the id may now be another's.
	k := 0
	for _, kl := range o.kills {
		if c.run != "" && kl.run == c.run {
			o.kills[k] = kl
			k++
		}
	}
	clear(o.kills[k:])
	o.kills = o.kills[:k]
	for _, kl := range o.kills {
		c.begin(4)
		c.bulk("CLIENT")
		c.bulk("KILL")
		c.bulk("ID")
		c.bulkInt(kl.id)
	}
	// The killed fence writes, where their holds are still there and
	// have no fence stored (see owedFenceScript).
	for _, f := range o.fences {
		c.begin(3 + 3 + 3)
		c.bulk(evalName(false))
		c.bulk(scriptSource(scriptOwedFence, false))
		c.bulk("3")
		c.bulk3(n.prefix, "lock:", f.base)
		c.bulk(n.fenceKey)
		c.bulk3(n.prefix, "lockf:", f.base)
		c.bulk(f.token)
		c.bulkInt(int64(f.slot))
		c.bulkInt(f.fence)
	}
	for _, r := range o.releases {
		n.addLateGrantRelease(c, r.base, r.token, cmp.Or(r.attempt, r.mark), r.read)
	}
	// Written, the releases are owed no more, answered or not (see lost).
	o.inKills = len(o.kills)
	o.inFences = len(o.fences)
	o.inReleases = append(o.inReleases[:0], o.releases...)
	clear(o.releases)
	o.releases = o.releases[:0]
	n.writeSweeps(c, o, now)
}

// writeSweeps adds the owed sweeps to c's batch, after the other debts:
// those whose connection is gone, and, when their pace is due (sweepAt),
// the sweeps that cannot wait for their connection to be known gone
// (blind, or c's server not known) and one CLIENT LIST ID asking about
// the connections of c's server that may still run their writes. A
// connection of another server is gone (it restarted).
func (n *Node) writeSweeps(c *nodeConn, o *owed, now time.Time) {
	if len(o.sweeps) == 0 {
		return
	}
	paced := !now.Before(o.sweepAt)
	ids := o.inCheck[:0]
	for i := range o.sweeps {
		s := &o.sweeps[i]
		if s.state == sweepWatched && c.run != "" && s.run != c.run {
			s.state = sweepGone
		}
		switch {
		case s.state == sweepGone, paced && (s.state == sweepBlind || c.run == ""):
			n.addSweep(c, s)
			s.sent = true
			o.inSweeps++
		case paced && s.state == sweepWatched && !slices.Contains(ids, s.id):
			ids = append(ids, s.id)
		}
	}
	if len(ids) > 0 {
		c.begin(3 + len(ids))
		c.bulk("CLIENT")
		c.bulk("LIST")
		c.bulk("ID")
		for _, id := range ids {
			c.bulkInt(id)
		}
	}
	o.inCheck = ids
	if paced {
		o.sweepAt = now.Add(o.sweepEvery)
		o.sweepEvery = min(2*o.sweepEvery, debtRetryMax)
	}
}

// addSweep adds s's sweep (see sweepFenceScript). Always EVAL: it is rare.
func (n *Node) addSweep(c *nodeConn, s *owedSweep) {
	beginScript(c, scriptSweepFence, false, 2, 2)
	c.bulk3(n.prefix, "lock:", s.base)
	c.bulk3(n.prefix, "lockf:", s.base)
	c.bulk(s.token)
	c.bulkInt(s.fence)
}

// readDebts reads the answers to what writeDebts sent. Any answer pays
// its entry: a kill's 0 (no such client: gone already) or its error (an
// ACL) leaves nothing more to do, nor does a release's error.
func (n *Node) readDebts(c *nodeConn, o *owed, r *reply) error {
	kills, fences := o.inKills, o.inFences
	read := 0
	defer func() {
		// The kills and fence writes answered are paid, also when a
		// later read failed; one not answered is owed still (see lost).
		k := min(read, kills)
		o.kills = o.kills[:copy(o.kills, o.kills[k:])]
		f := min(max(read-kills, 0), fences)
		o.fences = o.fences[:copy(o.fences, o.fences[f:])]
		o.inKills, o.inFences = 0, 0
	}()
	for ; read < kills+fences+len(o.inReleases); read++ {
		if err := c.read(r); err != nil {
			return err
		}
		if read < kills {
			id := strconv.FormatInt(o.kills[read].id, 10)
			if r.err != nil {
				n.log.Debug("killing a dropped connection refused", zap.String("client_id", id), zap.String("reason", reasonOf(r.err)))
			} else {
				n.log.Debug("killed a dropped connection", zap.String("client_id", id), zap.Int64("killed", r.n))
			}
			continue
		}
		if read < kills+fences {
			if r.err != nil {
				n.log.Debug("owed fence write refused", zap.String("key", o.fences[read-kills].base), zap.String("reason", reasonOf(r.err)))
			}
			continue
		}
		rl := &o.inReleases[read-kills-fences]
		if r.err != nil {
			n.log.Debug("owed release refused", zap.String("key", rl.base), zap.String("reason", reasonOf(r.err)))
		} else if rs, err := releaseResults(r, 1); err == nil && rs[0] == 1 {
			n.log.Debug("owed release removed a late acquire", zap.String("key", rl.base))
		}
	}
	clear(o.inReleases)
	o.inReleases = o.inReleases[:0]
	return n.readSweeps(c, o, r)
}

// readSweeps reads the answers to what writeSweeps sent. Any answer pays
// the sweep of a connection gone (a refusal too: sent again, it would be
// refused again); a blind one stays owed until its lease ends. The
// check's answer tells which connections are gone.
func (n *Node) readSweeps(c *nodeConn, o *owed, r *reply) error {
	defer o.unsentSweeps()
	for i := range o.sweeps {
		s := &o.sweeps[i]
		if !s.sent {
			continue
		}
		if err := c.read(r); err != nil {
			return err
		}
		switch {
		case transientRefusal(r.err):
			// Nothing ran (a node busy with a long script, loading):
			// sent again.
			s.sent = false
			n.log.Debug("sweeping a dropped connection's fence write put off", zap.String("key", s.base), zap.String("reason", reasonOf(r.err)))
		case r.err != nil:
			n.log.Debug("sweeping a dropped connection's fence write refused", zap.String("key", s.base), zap.String("reason", reasonOf(r.err)))
		case r.kind == ':' && r.n == 1:
			n.log.Debug("swept a dropped connection's late fence write", zap.String("key", s.base), zap.Int64("client_id", s.id))
		}
	}
	o.sweeps = slices.DeleteFunc(o.sweeps, func(s owedSweep) bool { return s.sent && s.state == sweepGone })
	if len(o.inCheck) == 0 {
		return nil
	}
	if err := c.read(r); err != nil {
		return err
	}
	n.checked(o, r, time.Now())
	return nil
}

// checked applies the answer r to CLIENT LIST ID o.inCheck at now: a
// connection the node no longer lists is gone, its sweeps due. Where the
// node refuses the command (an ACL without CLIENT LIST, a Redis before
// 6.2) those connections cannot be known gone, and their writes are swept
// blind, at the owed pace, until their lease ends.
func (n *Node) checked(o *owed, r *reply, now time.Time) {
	var listed []int64
	if transientRefusal(r.err) {
		// Nothing ran: asked again at the pace.
		n.log.Debug("asking whether dropped connections are gone put off", zap.String("reason", reasonOf(r.err)))
		return
	}
	refused := r.err != nil || r.kind != '$'
	if refused {
		reason := "unexpected reply"
		if r.err != nil {
			reason = reasonOf(r.err)
		}
		n.log.Debug("asking whether dropped connections are gone refused: their fence writes swept until their lease ends", zap.String("reason", reason))
	} else {
		listed = listedClientIDs(r.s)
	}
	for i := range o.sweeps {
		s := &o.sweeps[i]
		if s.state != sweepWatched || !slices.Contains(o.inCheck, s.id) {
			continue
		}
		switch {
		case refused:
			s.state = sweepBlind
		case slices.Contains(listed, s.id):
			s.listed = now
		default:
			s.state = sweepGone
		}
	}
	if refused {
		// The blind sweeps go with the next write.
		o.sweepAt, o.sweepEvery = now, debtRetryMin
	}
}

// listedClientIDs are the client ids of a CLIENT LIST answer: one line
// per client, each starting "id=<id> ".
func listedClientIDs(list []byte) []int64 {
	var ids []int64
	for line := range bytes.Lines(list) {
		rest, ok := bytes.CutPrefix(line, []byte("id="))
		if !ok {
			continue
		}
		if i := bytes.IndexByte(rest, ' '); i >= 0 {
			rest = rest[:i]
		}
		if id, err := strconv.ParseInt(string(bytes.TrimSpace(rest)), 10, 64); err == nil {
			ids = append(ids, id)
		}
	}
	return ids
}

// transientRefusal tells whether err is an error reply that says the
// command did not run for now (a node busy with another client's script,
// loading its data, a cluster slot moving): not an answer to pay a debt
// with, nor a refusal for good.
func transientRefusal(err error) bool {
	if err == nil {
		return false
	}
	for _, p := range []string{"BUSY ", "LOADING ", "TRYAGAIN ", "MASTERDOWN "} {
		if strings.HasPrefix(err.Error(), p) {
			return true
		}
	}
	return false
}
