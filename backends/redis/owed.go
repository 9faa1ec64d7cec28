package redis

import (
	"slices"
	"strconv"
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
//   - its unanswered exclusive acquires (doubts), killed or not, until
//     their roll-back (a failed attempt's release, never a holder's
//     UNLOCK: see settles) is written or owed;
//   - the roll-backs of doubts that could not be written at all (no
//     connection, see unsent): owed releases. A release written to a
//     connection is never sent again, answered or not: it may have run,
//     and run twice it takes another hold of its token (a reentrant
//     holder's last).
//
// and the first batch on its next connection starts with CLIENT KILL ID
// for each kill, then the owed releases, in the same write, ahead of
// everything else. Once the node has run the kill, the old connection can
// run nothing more. The roll-back of a doubt, owed or written later, goes
// out as lateGrantReleaseScript: it removes the token's hold only where
// the acquire's SET NX made it (no stored fence, no extra holds), never a
// hold the token had before the acquire, which a plain release would take
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
// A writer that never dropped a connection with an acquire on it has no
// owed (nil), and its batches pay nothing for it.
type owed struct {
	kills []owedKill
	// fences are the fence writes a kill stopped: written again after
	// the kills (owedFenceScript), which stores the lockf only while the
	// token still holds the key and has none stored. Without it the hold
	// would have no lockf, and the roll-back of a later reentrant acquire
	// in doubt (lateGrantReleaseScript) would take it for that acquire's
	// SET NX's and remove it. Each is owed only until its acquire's start
	// plus its TTL (see keepWithin).
	fences   []owedFence
	releases []owedRelease
	doubts   []owedAcquire
	// down is the last time the writer failed to reach the node.
	down time.Time
	// inKills is how many of the first kills the connection's current
	// batch carries, their answers still to read; inReleases are the owed
	// releases it carries, no longer owed (written), their answers still
	// to read.
	inKills    int
	inFences   int
	inReleases []owedRelease
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
	owedTime
}

type owedAcquire struct {
	base, token string
	owedTime
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
}

// empty tells whether nothing is owed or in doubt.
func (o *owed) empty() bool {
	return len(o.kills) == 0 && len(o.fences) == 0 && len(o.releases) == 0 && len(o.doubts) == 0
}

// due tells whether something is to be sent.
func (o *owed) due() bool { return len(o.kills) > 0 || len(o.fences) > 0 || len(o.releases) > 0 }

// reading tells whether answers to debts written on the connection are
// still to be read.
func (o *owed) reading() bool { return o.inKills > 0 || o.inFences > 0 || len(o.inReleases) > 0 }

// settle removes the latest acquire in doubt of base by token and returns
// its TTL entry: its roll-back is owed, or was written.
func (o *owed) settle(base, token string) (owedTime, bool) {
	for i := len(o.doubts) - 1; i >= 0; i-- {
		if d := o.doubts[i]; d.base == base && d.token == token {
			o.doubts = slices.Delete(o.doubts, i, i+1)
			return d.owedTime, true
		}
	}
	return owedTime{}, false
}

func (o *owed) owe(p *op, t owedTime) {
	o.releases = push(o.releases, owedRelease{base: p.base, token: p.token, owedTime: t})
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
// Its unanswered exclusive acquires are kept in doubt whatever else it
// carried (a read acquire's roll-back stays a plain release), so
// that their roll-backs go out as lateGrantReleaseScript and never take a
// hold their token had before. The connection is killed from the next one
// only when it carried no unanswered release, owed release or unmark:
// those must run (a user's UNLOCK killed would leave the key until its
// TTL, and cannot be sent again). Unanswered fence writes, extends and
// raises do not prevent it (their loss is a failure already). Without the
// kill an acquire in doubt may still land after its roll-back and keep
// its key until its TTL, as one could before kills.
func (o *owed) lost(unanswered []*op, fences unansweredFences, id int64, run string, now time.Time) {
	o.down = now
	o.inKills = 0  // not answered: sent again (a kill can run twice)
	o.inFences = 0 // likewise (they store nothing once the hold is gone)
	carried := len(o.inReleases) > 0
	clear(o.inReleases)
	o.inReleases = o.inReleases[:0] // written: never sent again
	kill := !carried && killable(unanswered, fences.killable())
	ttl := fences.ttl()
	for _, p := range unanswered {
		if lateGrantable(p) {
			t := time.Duration(p.ms) * time.Millisecond
			o.doubts = push(o.doubts, owedAcquire{base: p.base, token: p.token, owedTime: owedTime{now, t}})
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

// lateGrantable tells whether p is an acquire kept in doubt when its
// answer is lost: an exclusive one, whose hold lateGrantReleaseScript
// knows (its SET NX's). A read acquire's hold is the token's entry among
// the readers, which that script does not remove (the lock key is the
// read marker): its roll-back stays a plain release of the read hold, as
// before owed, so that a read acquire that ran before it does not keep
// the key for its TTL.
func lateGrantable(p *op) bool {
	return p.kind == opAcquire && p.mode != quorum.Shared
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
// may be killed: an exclusive acquire among them, or fence writes that
// are reason to (fences), and no release, unmark or read acquire (whose
// plain roll-back, after a kill that stopped it, would take a read hold
// its token had before).
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
// doubt: a failed exclusive attempt's release. A holder's UNLOCK (one of
// its holds, whatever the doubt) and a read attempt's roll-back (its
// read hold) stay plain releases.
func settles(p *op) bool {
	return p.kind == opRelease && p.rollback && p.hold != quorum.ReadHold
}

// unsent records a batch that could not be sent at now (no connection):
// its releases of acquires in doubt are owed, one per doubt.
func (o *owed) unsent(ops []*op, now time.Time) {
	o.down = now
	for _, p := range ops {
		if !settles(p) {
			continue
		}
		if t, ok := o.settle(p.base, p.token); ok {
			o.owe(p, owedTime{now, t.ttl})
		}
	}
}

// written records that ops are about to be written to a connection: a
// release of an acquire in doubt settles it, and goes out as its
// roll-back (lateGrantReleaseScript), never to be sent again.
func (o *owed) written(ops []*op) {
	for _, p := range ops {
		if settles(p) && !p.lateGrant {
			_, p.lateGrant = o.settle(p.base, p.token)
		}
	}
}

// wait is the channel on which the writer's next own attempt to pay is
// due.
func (o *owed) wait() <-chan time.Time {
	if o.retry == 0 {
		o.retry = debtRetryMin
	}
	if o.timer == nil {
		o.timer = time.NewTimer(o.retry)
	} else {
		o.timer.Reset(o.retry)
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
		n.addLateGrantRelease(c, r.base, r.token)
	}
	// Written, the releases are owed no more, answered or not (see lost).
	o.inKills = len(o.kills)
	o.inFences = len(o.fences)
	o.inReleases = append(o.inReleases[:0], o.releases...)
	clear(o.releases)
	o.releases = o.releases[:0]
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
	return nil
}
