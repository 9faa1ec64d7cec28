package zookeeper

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/go-zookeeper/zk"
	"go.uber.org/zap"

	"github.com/lockproxy/lockproxy/backends"
)

// releaseTimeout bounds the clean-up of a node whose Lock gave up (its
// context may be done already).
const releaseTimeout = 2 * time.Second

// leaseRetry is how soon a lease end that could not delete its node is
// tried again.
const leaseRetry = 100 * time.Millisecond

// maxCAS bounds the read-modify-write retries of one hold change: another
// instance changing the same node's data that often in a row is a bug.
const maxCAS = 16

// validity is what the holder may count on after a grant or renewal whose
// last successful round trip started at t0: the lease, capped by the
// session's horizon (the session, and so the node, cannot end sooner after
// that round trip reached a server), less elapsed time and drift.
func (b *Backend) validity(ttl time.Duration, t0 time.Time) time.Duration {
	return b.validityAt(ttl, t0, time.Now())
}

// validityAt is validity as of now. The drift allowance is counted on the
// time counted on (the lease or the session's horizon, whichever is
// shorter), not on the lease: a lease far longer than the session would
// otherwise leave no validity at all, and a held lock would read as lost.
func (b *Backend) validityAt(ttl time.Duration, t0, now time.Time) time.Duration {
	d := min(ttl, b.sessionHorizon())
	return d - now.Sub(t0) - time.Duration(float64(d)*b.cfg.DriftFactor) - b.cfg.DriftMin
}

// sessionHorizon is how long after the start of a round trip that reached
// a server the session is sure to live. It is not the session timeout S:
// in an ensemble only the leader expires sessions, and a follower tells it
// of the sessions it heard from only when it answers the leader's pings,
// every half tick. A follower cut off from its peers right after the round
// trip never reports it: the leader counts S from the last touch the
// follower did report, that of a message that reached the follower at
// least half a tick before the cut. go-zookeeper pings every S/3, so that
// message left the client no more than S/3 + tick/2 before the cut, which
// came after the round trip reached the follower (then following): the
// session lives at least 2S/3 - tick/2 after the round trip's start (the
// leader rounds expiries up to a tick, never down). Not covered: a
// follower already cut off when the round trip reached it, which serves
// reads for up to syncLimit ticks (a grant's last round trip is a read),
// and a host or server clock that runs slow beyond the drift allowance.
//
// S is the smaller of the timeout asked for and the one the server
// negotiated (see Backend.sessionTimeout). The tick is Config.ServerTick
// when set; else S/2, the most it can be when the servers'
// minSessionTimeout is ZooKeeper's default of two ticks (no session is
// negotiated shorter), so that the horizon is then 5S/12.
func (b *Backend) sessionHorizon() time.Duration {
	s := b.sessionTimeout()
	tick := b.cfg.ServerTick
	if tick <= 0 {
		tick = s / 2
	}
	return max(s*2/3-tick/2, 0)
}

// sessionTimeout is the smaller of the session timeout asked for and the
// one the server answered the last session handshake with (it clamps the
// one asked for to its minSessionTimeout and maxSessionTimeout).
func (b *Backend) sessionTimeout() time.Duration {
	s := b.cfg.SessionTimeout
	if n := time.Duration(b.negotiatedMS.Load()) * time.Millisecond; n > 0 && n < s {
		s = n
	}
	return s
}

// leaseLeft is the TTL LOCKINFO shows for a node with data d and stat st
// at now: the validity a grant or renewal at the lease's start would have
// left by now, so never more than the holder was told it may count on
// (the lease capped by the session's horizon, less drift), as RedLock's
// LOCKINFO never shows more than a majority would honour. The start may
// come from another host's clock: one ahead of this one cannot make the
// lease look longer than it is.
func (b *Backend) leaseLeft(d lockData, st *zk.Stat, now time.Time) time.Duration {
	start := d.leaseStart(st)
	if start.After(now) {
		start = now
	}
	return max(b.validityAt(d.ttl, start, now), 0)
}

// validityOf is validity for a change to node n: 0 when it is under
// backends.MinValidity (too late to be of use), and no more than backends.MinValidity when
// n lives in another instance's session. That session, not this one,
// bounds the node's life, and this instance cannot tell how long it has
// left (its instance may be stopping, or gone and the session about to
// expire): a renewal or reentry through it keeps the hold but promises
// nothing, as the least validity the callers report says.
func (b *Backend) validityOf(n node, ttl time.Duration, t0, now time.Time) time.Duration {
	v := b.validityAt(ttl, t0, now)
	switch {
	case v < backends.MinValidity:
		return 0
	case !b.ownSession(n):
		return backends.MinValidity
	}
	return v
}

// takeBack releases the hold a grant of req added to node n (as written
// or read) when the grant came too late to be of use (a validity under
// backends.MinValidity), within releaseTimeout (the caller's context may
// be done). The lease stays as it is: a grant that joined a hold never
// shortened it. Only n is changed: its lease is about to end, and once it
// is gone the hold went with it, while a node the token holds by then is
// another LOCK's, granted since, whose holds are all its own. Best effort:
// on failure the token keeps one hold more than it was told of until an
// UNLOCK or the lease's end. It is waited for while the caller's ctx
// lasts (see within).
func (b *Backend) takeBack(ctx context.Context, req backends.LockRequest, n node) {
	within(ctx, func() {
		if b.testBeforeTakeBack != nil {
			b.testBeforeTakeBack()
		}
		ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
		defer cancel()
		err := b.usable()
		if err == nil {
			_, err = b.releaseNode(ctx, n, req.Key, req.Token, kindOf(req.Mode), false)
		}
		if err != nil {
			b.log.Warn("zookeeper: could not take back the hold of a grant too late to be of use; it stays until an UNLOCK or its lease ends",
				zap.Error(err))
		}
	})
}

// within runs f, a clean-up with a bound of its own (its caller's context
// may be done), and waits for it while ctx lasts: once ctx is done f goes
// on in the background, so that the caller returns by then.
func within(ctx context.Context, f func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	select {
	case <-done:
	case <-ctx.Done():
	}
}

// ownSession reports whether n was made in this instance's session: it is
// one this instance tracks, or its ephemeral owner is this session.
func (b *Backend) ownSession(n node) bool {
	b.mu.Lock()
	_, tracked := b.owned[n.path]
	b.mu.Unlock()
	return tracked || n.stat != nil && n.stat.EphemeralOwner != 0 && n.stat.EphemeralOwner == b.conn.SessionID()
}

// node is a lock node as read: its place among the key's children, data
// and stat.
type node struct {
	path  string
	idx   int
	data  lockData
	stat  *zk.Stat
	kids  []child
	child child
}

func (b *Backend) children(ctx context.Context, dir string) ([]child, error) {
	names, err := call(ctx, func() ([]string, error) { n, _, err := b.conn.Children(dir); return n, err })
	if errors.Is(err, zk.ErrNoNode) {
		return nil, nil
	}
	if err != nil {
		return nil, zkErr("children", err)
	}
	kids, err := sortChildren(names)
	if err != nil {
		return nil, fmt.Errorf("%w (%s)", err, dir)
	}
	return kids, nil
}

// syncedChildren is children after a sync of dir: what the server reads
// is then at least what the ensemble had committed when the sync began.
func (b *Backend) syncedChildren(ctx context.Context, dir string) ([]child, error) {
	_, err := call(ctx, func() (string, error) { return b.conn.Sync(dir) })
	if err != nil && !errors.Is(err, zk.ErrNoNode) {
		return nil, zkErr("sync", err)
	}
	return b.children(ctx, dir)
}

type got struct {
	data lockData
	stat *zk.Stat
}

// get reads a lock node; ok is false when it is gone.
func (b *Backend) get(ctx context.Context, path string) (got, bool, error) {
	r, err := call(ctx, func() (got, error) {
		raw, st, err := b.conn.Get(path)
		if err != nil {
			return got{}, err
		}
		d, err := decodeData(raw)
		return got{d, st}, err
	})
	if errors.Is(err, zk.ErrNoNode) {
		return got{}, false, nil
	}
	if err != nil {
		return got{}, false, zkErr("get", err)
	}
	return r, true, nil
}

// heldKey names a token's hold on a key.
type heldKey struct{ key, token string }

// cached returns the granted node token holds on key that this instance
// created, as last written or read here: reenter, Unlock and Renew then
// need no lookup, and a stale copy only costs a version conflict.
func (b *Backend) cached(key, token string) (node, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	o := b.byToken[heldKey{key, token}]
	if o == nil {
		return node{}, false
	}
	return node{path: o.path, data: o.data, stat: &zk.Stat{Version: o.version, Czxid: o.czxid, Mtime: o.mtime}}, true
}

// findToken finds the node token holds on key (a write node before a read
// node); ok is false when it holds none. Only granted nodes count. With
// useCache, this instance's copy of a node it created is taken as is: it
// may be of a node gone since, released and taken again through another
// instance, so a caller whose write finds it gone looks again without.
func (b *Backend) findToken(ctx context.Context, key, token string, useCache bool) (node, bool, error) {
	if n, ok := b.cached(key, token); ok && useCache {
		return n, true, nil
	}
	dir := keyDir(b.cfg.Root, key)
	kids, err := b.children(ctx, dir)
	if err != nil {
		return node{}, false, err
	}
	return b.heldBy(ctx, dir, kids, token, "")
}

// heldBy finds among kids the granted node of token (a write node before
// a read node), other than the one named skip.
func (b *Backend) heldBy(ctx context.Context, dir string, kids []child, token, skip string) (node, bool, error) {
	found, err := b.heldNodes(ctx, dir, kids, token, skip)
	if err != nil || len(found) == 0 {
		return node{}, false, err
	}
	for _, n := range found {
		if n.data.write > 0 {
			return n, true, nil
		}
	}
	return found[0], true, nil
}

// heldNodes finds among kids every granted node of token, other than the
// one named skip.
func (b *Backend) heldNodes(ctx context.Context, dir string, kids []child, token, skip string) ([]node, error) {
	held, _, err := b.tokenNodes(ctx, dir, kids, token, skip)
	return held, err
}

// tokenNodes finds among kids every node of token other than the one named
// skip: granted ones, and waiting ones (in queue order). Only children
// whose name has the token's hash are read, so it costs no request when
// the token has no other node.
func (b *Backend) tokenNodes(ctx context.Context, dir string, kids []child, token, skip string) (held, waiting []node, err error) {
	h := tokenHash(token)
	for i, c := range kids {
		if c.hash != h || c.name == skip {
			continue
		}
		p := dir + "/" + c.name
		g, ok, err := b.get(ctx, p)
		if err != nil {
			return nil, nil, err
		}
		if !ok || g.data.token != token {
			continue
		}
		n := node{path: p, idx: i, data: g.data, stat: g.stat, kids: kids, child: c}
		bl, err := b.blocker(ctx, dir, n)
		if err != nil {
			return nil, nil, err
		}
		if bl.name == "" {
			held = append(held, n)
		} else {
			waiting = append(waiting, n)
		}
	}
	return held, waiting, nil
}

// holdKind says which of a token's holds a release or renewal is for.
type holdKind uint8

const (
	anyHold   holdKind = iota // UNLOCK and RENEW: write holds first
	writeHold                 // backends.HoldKeeper, backends.Write
	readHold                  // backends.HoldKeeper, backends.Read
)

func kindOf(mode backends.Mode) holdKind {
	if mode == backends.Read {
		return readHold
	}
	return writeHold
}

// has reports whether d has a hold of kind k.
func (k holdKind) has(d lockData) bool {
	switch k {
	case writeHold:
		return d.write > 0
	case readHold:
		return d.read > 0
	}
	return d.write > 0 || d.read > 0
}

// findTokenHold is findToken for a hold of kind k: the node token holds
// on key with such a hold. A cached copy without one may be stale (the
// hold added through another instance) and a token may, rarely, hold two
// nodes of a key: the key's nodes are read then.
func (b *Backend) findTokenHold(ctx context.Context, key, token string, k holdKind, useCache bool) (node, bool, error) {
	if k == anyHold {
		return b.findToken(ctx, key, token, useCache)
	}
	if n, ok := b.cached(key, token); ok && useCache && k.has(n.data) {
		return n, true, nil
	}
	dir := keyDir(b.cfg.Root, key)
	kids, err := b.children(ctx, dir)
	if err != nil {
		return node{}, false, err
	}
	found, err := b.heldNodes(ctx, dir, kids, token, "")
	if err != nil {
		return node{}, false, err
	}
	for _, n := range found {
		if k.has(n.data) {
			return n, true, nil
		}
	}
	return node{}, false, nil
}

// blocking is what a node waits for.
type blocking struct {
	// name is the blocking node's, "" when the node holds its lock.
	name string
	// reader: the node waiting is a reader, blocked by name's write holds
	// rather than by name itself.
	reader bool
	// version is, for a reader's blocker, the data version it was judged
	// by (-1 otherwise): a change between that read and the watch would
	// not fire the watch, so the watch's own stat must still show it.
	version int32
	// gated: the reader's blocker has a gate, which the reader watches.
	gated bool
}

// blocker says what node n waits for. A node with write holds waits for
// every earlier node; a reader waits for the nearest earlier node that
// still has write holds (writer preference: a waiting writer blocks later
// readers).
func (b *Backend) blocker(ctx context.Context, dir string, n node) (blocking, error) {
	if n.data.write > 0 {
		if n.idx > 0 {
			return blocking{name: n.kids[n.idx-1].name, version: -1}, nil
		}
		return blocking{version: -1}, nil
	}
	for j := n.idx - 1; j >= 0; j-- {
		c := n.kids[j]
		if c.kind != kindWrite {
			continue
		}
		g, ok, err := b.get(ctx, dir+"/"+c.name)
		if err != nil {
			return blocking{}, err
		}
		if ok && g.data.write > 0 {
			return blocking{name: c.name, reader: true, version: g.stat.Version, gated: g.data.hasGate()}, nil
		}
	}
	return blocking{version: -1}, nil
}

// waitTarget is what a waiting Lock watches.
type waitTarget struct {
	path string // the node waited for
	// gate, when set, is watched instead: path's gate, deleted when
	// path's write holds end.
	gate string
	// version: see blocking.version.
	version int32
	// reader: a change to path's data that leaves it write holds does not
	// unblock; one that ends them does.
	reader bool
	// any: every change to path is looked at (the token's own earlier
	// node, whose grant is such a change).
	any bool
}

// watched is a node read with a watch set on it.
type watched struct {
	data []byte
	stat *zk.Stat
	pw   *pathWatch
}

// pathWatch is the one go-zookeeper data watch this instance keeps on a
// path while it has not fired, shared by every waiter watching the path.
// go-zookeeper keeps a channel per watch set until the node changes, and a
// waiter that gives up cannot take its own back: one per waiter would
// pile up for as long as a blocker that never changes (a writer's gate, a
// waiting writer's node) is held.
type pathWatch struct {
	done chan struct{} // closed once the watch fired
	ev   zk.Event      // the event, set before done is closed
}

// share makes the pathWatch of the go-zookeeper watch ch just set on path,
// the one later waiters on path share until it fires.
func (b *Backend) share(path string, ch <-chan zk.Event) *pathWatch {
	pw := &pathWatch{done: make(chan struct{})}
	b.mu.Lock()
	if b.watches[path] == nil {
		b.watches[path] = pw
	}
	b.mu.Unlock()
	go func() {
		// Ends when the node changes, or with the session or the backend
		// (go-zookeeper then fails every watch).
		pw.ev = <-ch
		b.mu.Lock()
		if b.watches[path] == pw {
			delete(b.watches, path)
		}
		b.mu.Unlock()
		close(pw.done)
	}()
	return pw
}

// watch reads path and sets a watch on it, which fires when it changes or
// is deleted. When path is gone, ok is false and no watch is set: an
// exists watch would wait for its creation, which never comes (names are
// never reused), and would stay with the session, resent on every
// reconnect, for as long as it lives. A watch this instance has on path
// already is shared: it was set before this read, so it fires on any
// change after it (at worst on one before it, and the waiter looks again).
func (b *Backend) watch(ctx context.Context, path string) (watched, bool, error) {
	b.mu.Lock()
	pw := b.watches[path]
	b.mu.Unlock()
	w, err := call(ctx, func() (watched, error) {
		if pw != nil {
			data, st, err := b.conn.Get(path)
			return watched{data, st, pw}, err
		}
		data, st, ch, err := b.conn.GetW(path)
		if err != nil {
			return watched{}, err
		}
		return watched{data, st, b.share(path, ch)}, nil
	})
	if errors.Is(err, zk.ErrNoNode) {
		return watched{}, false, nil
	}
	if err != nil {
		return watched{}, false, zkErr("watch", err)
	}
	return w, true, nil
}

// arm sets the watch of a waiter waiting for w. ok is false when there is
// nothing to wait for (w's node or gate is gone, or changed since it was
// judged): the waiter looks again.
func (b *Backend) arm(ctx context.Context, w *waitTarget) (*pathWatch, bool, error) {
	if w.gate != "" {
		g, ok, err := b.watch(ctx, w.gate)
		if err != nil || ok {
			return g.pw, ok, err
		}
		// The writer's write holds ended, or it is gone. Unless its gate
		// went without them (deleted by hand): then wait on its data.
		n, ok, err := b.get(ctx, w.path)
		if err != nil || !ok || n.data.write == 0 {
			return nil, false, err
		}
		w.gate = ""
	}
	n, ok, err := b.watch(ctx, w.path)
	if err != nil || !ok {
		return nil, false, err
	}
	if w.version >= 0 && n.stat.Version != w.version {
		// Changed (a downgrade) since it was judged: look again rather
		// than wait for a change that already happened.
		return nil, false, nil
	}
	return n.pw, true, nil
}

// rearm is called when the data of the node a waiter waits for changed (a
// renewal, a reentry, a release of one of several holds): it sets the
// watch again, without reading the key's children, while the node still
// blocks the waiter. ok is false when it no longer does: the waiter looks
// again.
func (b *Backend) rearm(ctx context.Context, w *waitTarget) (*pathWatch, bool, error) {
	if w.any || w.gate != "" {
		// Any change is looked at; a gate's data never changes.
		return nil, false, nil
	}
	n, ok, err := b.watch(ctx, w.path)
	if err != nil || !ok {
		return nil, false, err
	}
	if w.reader {
		if d, err := decodeData(n.data); err != nil || d.write == 0 {
			return nil, false, nil
		}
	}
	b.rearms.Add(1)
	return n.pw, true, nil
}

// lastLookTimeout bounds the look a LOCK … WAIT takes at the key when its
// wait runs out: a server answers it in milliseconds, and the caller asked
// to wait no longer than WAIT.
const lastLookTimeout = time.Second

// Lock acquires req (see backends.Backend): a reentrant or downgrading
// grant changes the token's node; otherwise it creates a node and waits,
// watching only its blocker (a reader: the blocking writer's gate), until
// it holds or req.Wait runs out.
func (b *Backend) Lock(ctx context.Context, req backends.LockRequest) (backends.Lease, error) {
	if !b.fits(req.Key, len(req.Token)) {
		return backends.Lease{}, fmt.Errorf("%w: key %d bytes, token %d bytes", errTooLarge, len(req.Key), len(req.Token))
	}
	if err := b.usable(); err != nil {
		return backends.Lease{}, err
	}
	start := time.Now()
	deadline := start.Add(req.Wait)
	dir := keyDir(b.cfg.Root, req.Key)

	if held, ok := b.cached(req.Key, req.Token); ok {
		lease, err := b.reenter(ctx, held, req, start)
		if !errors.Is(err, errHoldGone) {
			return lease, err
		}
		// Released meanwhile: take it the usual way.
	}

	// The lease of a first grant starts when it is judged granted, after
	// the create: recording the time before it keeps LOCKINFO from showing
	// more than the grant's validity, which counts from that judgment,
	// without another write. A waiter's lease so looks as if it began
	// when it queued, shorter than it is, until a renewal or reentry
	// records its start.
	want := lockData{ttl: req.TTL, startMS: time.Now().UnixMilli(), token: req.Token}
	kind := byte(kindWrite)
	if req.Mode == backends.Read {
		want.read, kind = 1, kindRead
	} else {
		want.write = 1
	}
	// Format 3: a write node comes with its gate.
	want.gated = true
	prefix := childPrefix(kind, tokenHash(req.Token), newNonce())
	gate := ""
	if kind == kindWrite {
		gate = gatePath(b.cfg.Root, dir, prefix)
	}
	path, err := b.createNode(ctx, dir, prefix, want.encode(), gate)
	if err != nil {
		return backends.Lease{}, err
	}
	name := path[len(dir)+1:]

	b.mu.Lock()
	expired := b.expired
	b.mu.Unlock()
	queued := false // counted in b.waiters
	defer func() {
		if queued {
			b.mu.Lock()
			if b.waiters[req.Key]--; b.waiters[req.Key] <= 0 {
				delete(b.waiters, req.Key)
			}
			b.waiting--
			b.mu.Unlock()
		}
	}()

	granted := false
	// cleanup bounds the wait for the node's delete when not granted: ctx,
	// or, once the last look found no server answering, nothing (the
	// delete goes on in the background).
	cleanup := ctx
	defer func() {
		if !granted {
			// Waited for while cleanup lasts, not past it.
			within(cleanup, func() { b.abandon(path) })
		}
	}()
	// The reads and watches of a LOCK … WAIT end by lastLookTimeout past
	// its WAIT: with no server answering (a link that drops everything,
	// not yet seen as lost), one made as the link went would wait for the
	// command's context, WAIT + TTL, or until the client library gives
	// the connection up (two thirds of the session timeout), though the
	// caller asked to wait WAIT. Writes keep ctx: a grant found is
	// written within it.
	wctx := ctx
	if req.Wait > 0 {
		c, cancel := context.WithDeadline(ctx, deadline.Add(lastLookTimeout))
		defer cancel()
		wctx = c
	}
	for {
		// The look after the wait ran out (its blocker may have gone
		// just now) has lastLookTimeout of its own.
		lctx, final := wctx, req.Wait > 0 && !time.Now().Before(deadline)
		if final {
			c, cancel := context.WithTimeout(ctx, lastLookTimeout)
			defer cancel()
			lctx = c
			if err := b.usable(); err != nil {
				// No session to look with: answered now, and the
				// node's delete goes on in the background.
				cancel()
				cleanup = lctx
				return backends.Lease{}, err
			}
		}
		// lastLook names a read or watch that the bound cut short.
		lastLook := func(err error) error {
			if err != nil && req.Wait > 0 && lctx.Err() != nil && ctx.Err() == nil {
				cleanup = lctx
				return noQuorum("no answer at the end of the WAIT", err)
			}
			return err
		}
		t0 := time.Now()
		kids, err := b.children(lctx, dir)
		if err != nil {
			return backends.Lease{}, lastLook(err)
		}
		idx := -1
		for i, c := range kids {
			if c.name == name {
				idx = i
				break
			}
		}
		if idx < 0 {
			// The session expired, or an UNLOCK with this token through
			// another instance took the node while it waited.
			return backends.Lease{}, noQuorum("lock node lost", errNodeGone)
		}
		// The node is made before looking, which saves a round trip on
		// every first grant. A token that holds the key through another
		// node (another instance, another LOCK with this token queued
		// before this one and granted since) reenters it, and this node
		// goes; one queued before this one and still waiting is waited
		// for: its grant makes this LOCK a reentry. Neither costs a
		// request unless the token has another node.
		held, ahead, err := b.tokenNodes(lctx, dir, kids, req.Token, name)
		if err != nil {
			return backends.Lease{}, lastLook(err)
		}
		if len(held) > 0 {
			n := held[0]
			for _, h := range held {
				if h.data.write > 0 {
					n = h
					break
				}
			}
			// From this look's start, not the LOCK's: the lease the token
			// holds may have been granted while this LOCK waited (another
			// LOCK with the token, queued before it), later than the LOCK
			// began; t0 is still before this attempt's write was sent.
			// The writes keep ctx: a write cut short by the bound may
			// still land, a hold no one was told of.
			lease, err := b.reenter(ctx, n, req, t0)
			if !errors.Is(err, errHoldGone) {
				return lease, err
			}
			// The hold went meanwhile: this node competes as a first
			// grant (the children are read again).
			continue
		}
		var w waitTarget
		if len(ahead) > 0 && ahead[0].idx < idx {
			w = waitTarget{path: ahead[0].path, version: ahead[0].stat.Version, any: true}
		} else {
			bl, err := b.blocker(lctx, dir, node{idx: idx, data: want, kids: kids})
			if err != nil {
				return backends.Lease{}, lastLook(err)
			}
			if bl.name == "" {
				lease, err := b.granted(ctx, req, path, want, t0, kids, idx)
				granted = err == nil
				return lease, err
			}
			w = waitTarget{path: dir + "/" + bl.name, version: bl.version, reader: bl.reader}
			if bl.gated {
				w.gate = gateOf(b.cfg.Root, w.path)
			}
		}
		if !time.Now().Before(deadline) {
			return backends.Lease{}, backends.ErrNotAcquired
		}
		if !queued {
			queued = true
			b.mu.Lock()
			b.waiters[req.Key]++
			b.waiting++
			b.mu.Unlock()
		}
		if b.testBeforeWatch != nil {
			b.testBeforeWatch(w.path[len(dir)+1:])
		}
		pw, ok, err := b.arm(lctx, &w)
		if err != nil {
			return backends.Lease{}, lastLook(err)
		}
		if !ok {
			continue
		}
		if err := b.await(lctx, &w, pw, deadline, expired); err != nil {
			return backends.Lease{}, lastLook(err)
		}
	}
}

// await waits, watching pw, until what w names no longer blocks (then the
// caller looks again), the deadline passes (one more look: the blocker may
// have gone just now), the session expires or ctx is done. A change that
// leaves it blocking, such as a renewal of the holder waited for, only
// sets the watch again.
func (b *Backend) await(ctx context.Context, w *waitTarget, pw *pathWatch, deadline time.Time, expired <-chan struct{}) error {
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	for {
		select {
		case <-pw.done:
			ev := pw.ev
			if ev.Err != nil {
				return zkErr("watch", ev.Err)
			}
			if ev.Type == zk.EventNodeDataChanged {
				next, ok, err := b.rearm(ctx, w)
				if err != nil {
					return err
				}
				if ok {
					pw = next
					continue
				}
			}
			b.wakeups.Add(1)
			return nil
		case <-timer.C:
			return nil
		case <-expired:
			return noQuorum("session expired", zk.ErrSessionExpired)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// create makes an ephemeral sequential node under dir, without a gate.
func (b *Backend) create(ctx context.Context, dir, prefix string, data []byte) (string, error) {
	return b.createNode(ctx, dir, prefix, data, "")
}

// createNode makes an ephemeral sequential node under dir, and with it, in
// the same transaction, the gate at gate unless that is "" (see gatesDir).
// It makes dir (a container, which the server deletes once it is empty)
// when missing. If the answer is lost with the connection, it looks for
// the node by its nonce and deletes it: the caller gets an error either
// way.
func (b *Backend) createNode(ctx context.Context, dir, prefix string, data []byte, gate string) (path string, err error) {
	madeDir := false // this call sent a create of dir
	defer func() {
		if err != nil && madeDir {
			// dir may be a container that never had a child, which
			// ZooKeeper keeps for good (see dropIfNeverUsed).
			go b.dropIfNeverUsed(dir)
		}
	}()
	for attempt := 0; ; attempt++ {
		ch := make(chan result[string], 1)
		go func() {
			if gate == "" {
				p, err := b.conn.Create(dir+"/"+prefix, data, zk.FlagEphemeralSequential, b.acl)
				ch <- result[string]{p, err}
				return
			}
			r, err := b.conn.Multi(
				&zk.CreateRequest{Path: dir + "/" + prefix, Data: data, Acl: b.acl, Flags: zk.FlagEphemeralSequential},
				&zk.CreateRequest{Path: gate, Acl: b.acl, Flags: zk.FlagEphemeral})
			switch {
			case err == nil && len(r) == 2:
				ch <- result[string]{r[0].String, nil}
			case err == nil:
				ch <- result[string]{"", fmt.Errorf("zookeeper: create: %d results for 2 operations", len(r))}
			case len(r) == 2 && r[0].Error == nil && errors.Is(r[1].Error, zk.ErrNoNode):
				ch <- result[string]{"", errNoGates}
			default:
				ch <- result[string]{"", err}
			}
		}()
		var r result[string]
		select {
		case r = <-ch:
		case <-ctx.Done():
			// The node may still be made: delete it when the answer comes,
			// or find it by its nonce when the answer is lost.
			go func() {
				switch r := <-ch; {
				case r.err == nil:
					b.abandon(r.v)
				case errors.Is(r.err, zk.ErrConnectionClosed):
					b.abandonByNonce(dir, prefix)
				}
			}()
			return "", ctx.Err()
		}
		switch {
		case r.err == nil:
			return r.v, nil
		case errors.Is(r.err, errNoGates) && attempt < 3:
			// Made at start; deleted by hand since.
			_, err := call(ctx, func() (string, error) { return b.conn.Create(gatesDir(b.cfg.Root), nil, 0, b.acl) })
			if err != nil && !errors.Is(err, zk.ErrNodeExists) {
				return "", zkErr("create gates", err)
			}
		case errors.Is(r.err, zk.ErrNoNode) && attempt < 3:
			// The key's container is missing (never made, or just
			// deleted by the server for being empty).
			madeDir = true
			_, err := call(ctx, func() (string, error) { return b.conn.CreateContainer(dir, nil, zk.FlagContainer, b.acl) })
			if err != nil && !errors.Is(err, zk.ErrNodeExists) {
				return "", zkErr("create key", err)
			}
		case errors.Is(r.err, zk.ErrConnectionClosed):
			go b.abandonByNonce(dir, prefix)
			return "", zkErr("create", r.err)
		default:
			return "", zkErr("create", r.err)
		}
	}
}

// dropIfNeverUsed deletes the key directory dir if it has never had a
// child. A createNode that made dir and then failed (the container's
// answer lost, or the client gone before its lock node was made) may
// leave it so, and ZooKeeper deletes a container only once it has had a
// child and lost it again (a never-used one only when its servers set
// znode.container.maxNeverUsedIntervalMs, 0 by default): each such
// failure on a new key would leave a znode on the ensemble for good. It
// waits for the connection as abandonByNonce does. A LOCK of the same key
// elsewhere that finds dir gone between its own create of dir and of its
// node makes dir again (createNode's attempts).
func (b *Backend) dropIfNeverUsed(dir string) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*b.cfg.SessionTimeout)
	defer cancel()
	for {
		for ctx.Err() == nil && !b.connected.Load() && !b.isClosed() {
			select {
			case <-ctx.Done():
			case <-time.After(50 * time.Millisecond):
			}
		}
		if b.isClosed() {
			return
		}
		// A sync first: the session may be back on a server that has not
		// applied the lost create yet.
		_, err := call(ctx, func() (string, error) { return b.conn.Sync(dir) })
		if errors.Is(err, zk.ErrNoNode) {
			return
		}
		var st *zk.Stat
		if err == nil {
			st, err = call(ctx, func() (*zk.Stat, error) {
				ok, st, err := b.conn.Exists(dir)
				if err == nil && !ok {
					return nil, zk.ErrNoNode
				}
				return st, err
			})
			if errors.Is(err, zk.ErrNoNode) {
				return
			}
		}
		if err == nil {
			if st.Cversion != 0 || st.NumChildren != 0 {
				return // used: the server deletes it once it is empty
			}
			_, err = call(ctx, func() (struct{}, error) { return struct{}{}, b.conn.Delete(dir, st.Version) })
			if err == nil || errors.Is(err, zk.ErrNoNode) || errors.Is(err, zk.ErrNotEmpty) || errors.Is(err, zk.ErrBadVersion) {
				return
			}
		}
		select {
		case <-ctx.Done():
			b.log.Warn("zookeeper: could not delete a key directory left without a lock node", zap.Error(err))
			return
		case <-time.After(leaseRetry):
		}
	}
}

// errNoGates: the parent of the gates is missing.
var errNoGates = errors.New("zookeeper: the gates' parent znode is missing")

// remove deletes the lock node at path if its data version is version,
// and with it its gate when withGate (its data at that version has one):
// the error is the node's delete's. A gate already gone (deleted by hand)
// does not keep the node from being deleted.
func (b *Backend) remove(ctx context.Context, path string, version int32, withGate bool) error {
	del := func() error {
		_, err := call(ctx, func() (struct{}, error) { return struct{}{}, b.conn.Delete(path, version) })
		return err
	}
	if !withGate {
		return del()
	}
	r, err := call(ctx, func() ([]zk.MultiResponse, error) {
		return b.conn.Multi(&zk.DeleteRequest{Path: path, Version: version},
			&zk.DeleteRequest{Path: gateOf(b.cfg.Root, path), Version: -1})
	})
	if err != nil && len(r) == 2 && r[0].Error == nil && errors.Is(r[1].Error, zk.ErrNoNode) {
		return del()
	}
	return err
}

// setData writes d to the lock node at path if its data version is
// version, deleting its gate in the same transaction when d ends the write
// holds of a node that has one (had is its data at that version). The
// error is the node's write's.
func (b *Backend) setData(ctx context.Context, path string, d lockData, version int32, had lockData) (*zk.Stat, error) {
	set := func() (*zk.Stat, error) {
		return call(ctx, func() (*zk.Stat, error) { return b.conn.Set(path, d.encode(), version) })
	}
	if !had.hasGate() || d.hasGate() {
		return set()
	}
	r, err := call(ctx, func() ([]zk.MultiResponse, error) {
		return b.conn.Multi(&zk.SetDataRequest{Path: path, Data: d.encode(), Version: version},
			&zk.DeleteRequest{Path: gateOf(b.cfg.Root, path), Version: -1})
	})
	switch {
	case err == nil && len(r) == 2 && r[0].Stat != nil:
		return r[0].Stat, nil
	case err == nil:
		return nil, fmt.Errorf("zookeeper: set: %d results for 2 operations", len(r))
	case len(r) == 2 && r[0].Error == nil && errors.Is(r[1].Error, zk.ErrNoNode):
		return set()
	}
	return nil, err
}

// abandon deletes a node this instance made but does not hold (a gave-up
// waiter), within releaseTimeout. When that fails (a blip: the delete was
// lost with the connection), the node would stay as long as the session,
// which outlives a blip, and once the nodes before it go it would hold the
// key for nobody: it is handed to the lease machinery with a lease already
// ended, which deletes it, retrying while disconnected, until it is gone or
// the session expires with it.
//
// The delete is conditional on the data version a waiting node has (0: its
// instance never changes it). A node whose data changed was taken as a
// hold meanwhile (the same token reentering through another instance, once
// the node came first): the lease machinery then enforces its lease
// instead of deleting it at once.
func (b *Backend) abandon(path string) {
	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer cancel()
	// The node's data as this instance made it (version 0): a write node
	// has a gate.
	var d lockData
	if c, ok := parseChild(path[strings.LastIndexByte(path, '/')+1:]); ok && c.kind == kindWrite {
		d = lockData{write: 1, gated: true}
	}
	err := b.remove(ctx, path, 0, d.hasGate())
	if err == nil || errors.Is(err, zk.ErrNoNode) {
		return
	}
	b.log.Debug("zookeeper: could not delete an abandoned lock node yet; retrying", zap.Error(err))
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.closed && b.owned[path] == nil {
		o := &ownedNode{path: path, data: d, version: 0, abandoned: true}
		b.owned[path] = o
		b.armLocked(o, leaseRetry)
	}
}

// abandonByNonce deletes the node whose create's answer was lost, once the
// session is back (if it expired, the node is gone anyway). It tries for
// a few session timeouts: longer than any blip the session survives.
func (b *Backend) abandonByNonce(dir, prefix string) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*b.cfg.SessionTimeout)
	defer cancel()
	b.mu.Lock()
	expired := b.expired
	b.mu.Unlock()
	for {
		for ctx.Err() == nil && !b.connected.Load() && !b.isClosed() {
			select {
			case <-ctx.Done():
			case <-expired:
				return // the node went with the session
			case <-time.After(50 * time.Millisecond):
			}
		}
		if b.isClosed() {
			return // the node goes with the session, which Close ended
		}
		// The session may be back on another server, one that has not
		// applied the lost create yet (a follower behind its leader):
		// a sync first brings it up to date, create included (the
		// leader answers a sync once its proposals before it are done).
		kids, err := b.syncedChildren(ctx, dir)
		if err == nil {
			for _, c := range kids {
				if c.name[:len(c.name)-seqDigits] == prefix {
					b.abandon(dir + "/" + c.name)
				}
			}
			return
		}
		select {
		case <-ctx.Done():
			b.log.Warn("zookeeper: could not look for a lock node whose create's answer was lost", zap.Error(err))
			return
		case <-expired:
			return
		case <-time.After(leaseRetry):
		}
	}
}

// granted completes a first grant of the node at path, kids[idx], made
// with data want: starts enforcing its lease, reads the node's czxid (the
// fence) and answers. It makes one round trip (the read): a LOCK with this
// token queued behind the node is woken in the background (see wake).
//
// The node may have been reentered before the grant completes: another
// LOCK with this token (through this instance or another) finds it held as
// soon as nothing blocks it, and adds its hold and, maybe, a longer lease,
// on which the validity it answered counts. The node is therefore tracked
// before it is read: such a change is either made before the read, which
// sees it, or recorded by written once the node is tracked, never neither;
// and the timer ends the node no sooner than the lease the read finds.
func (b *Backend) granted(ctx context.Context, req backends.LockRequest, path string, want lockData, t0 time.Time, kids []child, idx int) (backends.Lease, error) {
	o := &ownedNode{path: path, key: req.Key, token: req.Token, data: want}
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return backends.Lease{}, errClosed
	}
	b.owned[path] = o
	b.armUntilLocked(o, t0.Add(req.TTL))
	b.mu.Unlock()

	if b.testGrantRead != nil {
		b.testGrantRead(false)
	}
	g, ok, err := b.get(ctx, path)
	if b.testGrantRead != nil {
		b.testGrantRead(true)
	}
	if err == nil && !ok {
		err = noQuorum("lock node lost", errNodeGone)
		if b.validity(req.TTL, t0) < backends.MinValidity {
			// Too late to be of use anyway: its lease timer, armed for
			// t0 + TTL, may have deleted it.
			err = backends.ErrNotAcquired
		}
	}
	if err != nil {
		// Lock abandons the node: deleted unless reentered meanwhile,
		// whose lease the abandoned node's timer then enforces.
		b.forget(path)
		if errors.Is(err, backends.ErrNotAcquired) {
			return backends.Lease{}, err
		}
		return backends.Lease{}, fmt.Errorf("zookeeper: reading the granted lock node: %w", err)
	}
	read := time.Now()

	b.mu.Lock()
	switch {
	case b.closed:
		b.mu.Unlock()
		return backends.Lease{}, errClosed
	case b.owned[path] != o && b.validity(req.TTL, t0) < backends.MinValidity:
		// The lease ran out while it was read (its timer deleted the
		// node): too late to be of use, as below.
		b.mu.Unlock()
		return backends.Lease{}, backends.ErrNotAcquired
	case b.owned[path] != o:
		// The session expired (the node went with it).
		b.mu.Unlock()
		return backends.Lease{}, noQuorum("lock node lost", errNodeGone)
	}
	if g.stat.Version >= o.version {
		// Unless a later change made here is recorded already (written),
		// made to this data: it raised the timer itself.
		o.data, o.version, o.mtime = g.data, g.stat.Version, g.stat.Mtime
	}
	o.czxid = g.stat.Czxid
	if g.stat.Version > 0 {
		// Reentered before this grant (this instance never changes a
		// waiting node): the node's lease, as read, may end later than
		// this grant's. Its start may be on another host's clock, behind
		// or ahead of this one: the timer counts it from when it was read
		// (no sooner than it began) and as stored, whichever ends later.
		// For the timer a later end is the safe side: it deletes the node.
		stored := later(read.Add(g.data.ttl), g.data.leaseStart(g.stat).Add(g.data.ttl))
		if stored.After(o.end) {
			b.disarmLocked(o)
			b.armUntilLocked(o, stored)
		}
	}
	// Counted after the read, this grant's last round trip: nothing after
	// it is waited for.
	at := time.Now()
	v := b.validityAt(req.TTL, t0, at)
	if v < backends.MinValidity && o.version == 0 {
		// Too late to be of use, and not reentered: Lock deletes the
		// node.
		b.forgetLocked(o)
		b.mu.Unlock()
		return backends.Lease{}, backends.ErrNotAcquired
	}
	b.byToken[heldKey{req.Key, req.Token}] = o
	b.mu.Unlock()
	if v < backends.MinValidity {
		// Reentered before this grant: the node stays with the reentry's
		// holds, and this grant's is taken back, as a late reentry takes
		// back its own.
		b.takeBack(ctx, req, node{path: path, data: g.data, stat: g.stat})
		return backends.Lease{}, backends.ErrNotAcquired
	}

	if laterOfToken(kids, idx) {
		// Another LOCK with this token queued behind this one waits for a
		// change to this node (see Lock): the grant makes it a reentry.
		b.wake(path, g)
	}
	// The token's holds of this kind in the node as read: a reentry made
	// before the grant counts.
	holds := g.data.write
	if req.Mode == backends.Read {
		holds = g.data.read
	}
	// At: whatever passes from here to the reply is lease gone by.
	return backends.Lease{Token: req.Token, Validity: v, Fence: uint64(g.stat.Czxid), Holds: max(holds, 1), At: at}, nil
}

// wake rewrites the data of the granted node at path as read (g), which
// fires the watch of a LOCK with the same token queued behind it: the
// grant makes that LOCK a reentry. The write is made in the background:
// the grant's validity and lease must not depend on a second round trip,
// which a stalled connection can hold up for seconds after the lease was
// armed and the validity counted. A change to the node meanwhile fires the
// watch too, and fails the write (its version).
func (b *Backend) wake(path string, g got) {
	data, version := g.data.encode(), g.stat.Version
	set := func(ctx context.Context) (*zk.Stat, error) {
		return call(ctx, func() (*zk.Stat, error) { return b.conn.Set(path, data, version) })
	}
	hook := b.testBeforeWake // read here: a test resets it once the grant is answered
	go func() {
		if hook != nil {
			hook()
		}
		b.wakeLater(path, version, set)
	}()
}

// wakeLater makes wake's write, at the node's data version as granted,
// with a context of its own (the grant's may be done: its client gone),
// whenever the session is on a server (the connection may have dropped),
// until it is made, the node changed or went, or the session expired or
// the backend closed (the node then goes, which fires the watch); for a
// few session timeouts at most, as abandonByNonce. That LOCK would
// otherwise wait until its WAIT ends, nothing else changing the node.
func (b *Backend) wakeLater(path string, version int32, set func(context.Context) (*zk.Stat, error)) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*b.cfg.SessionTimeout)
	defer cancel()
	b.mu.Lock()
	expired := b.expired
	b.mu.Unlock()
	for {
		if b.connected.Load() {
			st, err := set(ctx)
			switch {
			case err == nil:
				b.mu.Lock()
				if o := b.owned[path]; o != nil && o.version == version {
					o.version, o.mtime = st.Version, st.Mtime
				}
				b.mu.Unlock()
				return
			case errors.Is(err, zk.ErrBadVersion), errors.Is(err, zk.ErrNoNode), errors.Is(err, zk.ErrClosing),
				errors.Is(err, zk.ErrSessionExpired):
				return
			}
			b.log.Debug("zookeeper: could not tell a LOCK with the same token of the grant yet; retrying", zap.Error(err))
		}
		if errors.Is(b.usable(), errClosed) {
			return
		}
		select {
		case <-ctx.Done():
			b.log.Warn("zookeeper: could not tell a LOCK with the same token of the grant; it waits until its WAIT ends",
				zap.String("node", path))
			return
		case <-expired:
			return
		case <-time.After(leaseRetry):
		}
	}
}

// laterOfToken reports whether a node queued after kids[idx] has its
// token's hash.
func laterOfToken(kids []child, idx int) bool {
	for _, c := range kids[idx+1:] {
		if c.hash == kids[idx].hash {
			return true
		}
	}
	return false
}

// reenter adds a hold to the node token already holds: one more write hold
// (reentrant), a read hold on a write node (downgrade) or on a read node
// (reentrant read). Asking for write on a read hold is ErrUpgrade. When the
// node is gone meanwhile (its lease ended, an UNLOCK through another
// instance) it returns errHoldGone, and the caller takes the key the usual
// way: not by calling Lock again, whose node would compete with the
// caller's own, which the caller then deletes.
func (b *Backend) reenter(ctx context.Context, n node, req backends.LockRequest, t0 time.Time) (backends.Lease, error) {
	if req.NoReentry {
		// SET NX's rule (transparent mode): held is held, whoever asks.
		return backends.Lease{}, backends.ErrNotAcquired
	}
	if req.Keepalive && !b.ownSession(n) {
		// The node lives in another instance's session, whose end this
		// one cannot see: the reentry, and every renewal of it through
		// this instance, would promise nothing (validityOf), so a
		// watchdog here could not keep it alive. Refused before any
		// write, leaving the token's holds as they were.
		return backends.Lease{}, backends.ErrKeepaliveElsewhere
	}
	if b.testBeforeReenter != nil {
		b.testBeforeReenter()
	}
	for range maxCAS {
		d := n.data
		if req.Mode == backends.Write {
			if d.write == 0 {
				return backends.Lease{}, backends.ErrUpgrade
			}
			d.write++
		} else {
			d.read++
		}
		// As on the other backends, a reentry never shortens the holder's
		// lease: it ends no sooner than it did, nor than req.TTL after t0.
		// The lease it had may have begun after t0 (granted to another
		// LOCK with this token while this one was on its way): restarting
		// it at t0 would end it early.
		d = d.raised(n.stat, t0, req.TTL)
		if err := b.settled(ctx, n.path); err != nil {
			return backends.Lease{}, err
		}
		done := b.changing(n.path)
		st, err := call(ctx, func() (*zk.Stat, error) { return b.conn.Set(n.path, d.encode(), n.stat.Version) })
		if errors.Is(err, zk.ErrConnectionClosed) {
			// The answer was lost with the connection, not necessarily
			// the write: made, it added a hold no one would be told of,
			// which would keep the key held after the holder's last
			// UNLOCK until the lease ends. Made, it is a grant.
			resolved := b.resolve(n.path)
			if got, ok := b.applied(ctx, n.path, n.stat.Version, d); ok {
				st, err = got, nil
			}
			resolved()
		}
		if err == nil {
			if b.testBeforeWritten != nil {
				b.testBeforeWritten()
			}
			b.written(n.path, n.data, d, st, leaseRaised, t0.Add(req.TTL))
		}
		done()
		switch {
		case err == nil:
			// Counted from t0, before the write was sent, for req.TTL: no
			// more than the lease now stored, which ends no sooner.
			at := time.Now()
			v := b.validityOf(n, req.TTL, t0, at)
			if v == 0 {
				// Too late to be of use: the hold just added is taken
				// back, and the LOCK answered not acquired.
				b.takeBack(ctx, req, node{path: n.path, data: d, stat: st})
				return backends.Lease{}, backends.ErrNotAcquired
			}
			holds := d.write
			if req.Mode == backends.Read {
				holds = d.read
			}
			return backends.Lease{Token: req.Token, Validity: v, Fence: uint64(n.stat.Czxid), Holds: holds, At: at}, nil
		case errors.Is(err, zk.ErrBadVersion):
			g, ok, err := b.get(ctx, n.path)
			if err != nil {
				return backends.Lease{}, err
			}
			if !ok {
				b.forget(n.path)
				return backends.Lease{}, errHoldGone
			}
			n.data, n.stat = g.data, g.stat
		case errors.Is(err, zk.ErrNoNode):
			b.forget(n.path)
			return backends.Lease{}, errHoldGone
		default:
			return backends.Lease{}, zkErr("set", err)
		}
	}
	return backends.Lease{}, errUnhandled
}

// leaseChange is how a data change moves the lease of the node.
type leaseChange uint8

const (
	// leaseKept: the lease goes on as it was (an UNLOCK of one of several
	// holds).
	leaseKept leaseChange = iota
	// leaseRaised: the lease ends no sooner than it did, nor than the
	// given end (a reentry, RenewHold).
	leaseRaised
	// leaseSet: the lease ends at the given end (RENEW sets it exactly).
	leaseSet
)

// written records a data change this instance made to path (when it owns
// the node): prev is the data the change was made to, d and st the node's
// data and stat after it. The lease timer then fires at end (leaseSet),
// or no sooner than end and than it would have (leaseRaised: it never
// moves earlier, whatever t0 the change was judged from).
//
// prev may carry a restart through another instance that this one has not
// seen yet (its timer would have seen it when it fired, by the version,
// and counted its TTL from then); this write makes the version current, so
// the timer would no longer see it: it is counted now, from now, unless
// the change set the lease anew (leaseSet).
func (b *Backend) written(path string, prev, d lockData, st *zk.Stat, how leaseChange, end time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	o := b.owned[path]
	if o == nil || st.Version < o.version {
		// Not its node; or a later change (made here, or read by its
		// timer) is recorded already, made to this one's data, and its
		// timer counts this one's lease.
		return
	}
	unseen := prev.startMS != o.data.startMS || prev.ttl != o.data.ttl
	o.data, o.version, o.mtime = d, st.Version, st.Mtime
	switch how {
	case leaseKept:
		end = o.end
	case leaseRaised:
		end = later(end, o.end)
	}
	if unseen && how != leaseSet {
		end = later(end, time.Now().Add(prev.ttl))
	}
	if how == leaseKept && end.Equal(o.end) {
		return // the timer stands
	}
	b.disarmLocked(o)
	if !b.closed {
		b.armUntilLocked(o, end)
	}
}

// changing marks a reentry or renewal about to be written to the node at
// path, when this instance enforces its lease, until done is called (after
// written). A change that keeps the node's stored lease (lockData.raised)
// changes its version without restarting it; the lease timer, firing
// between that change and its written, would take it for a change that
// left the lease ended (see leaseEnded) and delete the node. Yet the
// stored lease may have been started through an instance whose clock is
// ahead of this one: it ends, as stored, later than this timer, and the
// change may have been judged to fit in it with a validity past the timer's
// end, which only its written moves.
func (b *Backend) changing(path string) (done func()) {
	b.mu.Lock()
	defer b.mu.Unlock()
	o := b.owned[path]
	if o == nil {
		return func() {}
	}
	o.changing++
	return func() {
		b.mu.Lock()
		o.changing--
		b.mu.Unlock()
	}
}

// later is the later of t and u.
func later(t, u time.Time) time.Time {
	if u.After(t) {
		return u
	}
	return t
}

// Unlock releases one hold of key by token: write holds first.
func (b *Backend) Unlock(ctx context.Context, key, token string) (bool, error) {
	return b.release(ctx, key, token, anyHold)
}

// UnlockHold implements backends.HoldKeeper: one hold of the kind mode
// says, the node's other holds and its lease left as they are.
func (b *Backend) UnlockHold(ctx context.Context, key, token string, mode backends.Mode) (bool, error) {
	return b.release(ctx, key, token, kindOf(mode))
}

// release releases one hold of key by token of kind k.
func (b *Backend) release(ctx context.Context, key, token string, k holdKind) (bool, error) {
	if !b.fits(key, 0) {
		return false, nil // never locked (see fits)
	}
	if err := b.usable(); err != nil {
		return false, err
	}
	n, ok, err := b.findTokenHold(ctx, key, token, k, true)
	if err != nil || !ok {
		return false, err
	}
	return b.releaseNode(ctx, n, key, token, k, true)
}

// releaseNode releases one hold of kind k by token from node n. When n is
// found gone, follow says whether the token's node is looked for again
// (release: n may be a copy of a node released since, and the token may
// hold the key through a new one) or not (takeBack: the hold went with n).
func (b *Backend) releaseNode(ctx context.Context, n node, key, token string, k holdKind, follow bool) (bool, error) {
	for range maxCAS {
		d := n.data
		switch {
		case k != readHold && d.write > 0:
			d.write--
		case k != writeHold && d.read > 0:
			d.read--
		default:
			return false, nil
		}
		if err := b.settled(ctx, n.path); err != nil {
			return false, err
		}
		var err error
		if d.write == 0 && d.read == 0 {
			err = b.remove(ctx, n.path, n.stat.Version, n.data.hasGate())
			if errors.Is(err, zk.ErrConnectionClosed) {
				// The answer was lost with the connection, not necessarily
				// the delete. Made, it is the release, and an error would
				// have the client UNLOCK again and be told 0 (not held), a
				// lease it overran, when it released in time.
				resolved := b.resolve(n.path)
				if b.removedHere(ctx, n) {
					err = nil
				}
				resolved()
			}
			if err == nil {
				b.forget(n.path)
				return true, nil
			}
		} else {
			// The lease goes on as it was: its start and TTL are kept,
			// and so is the timer of the instance that made the node.
			// This write moves the node's mtime, so a node in the
			// previous format, whose lease ran from its last change,
			// records the time of that change as its start.
			if d.startMS == 0 {
				d.startMS = n.stat.Mtime
			}
			var st *zk.Stat
			st, err = b.setData(ctx, n.path, d, n.stat.Version, n.data)
			if errors.Is(err, zk.ErrConnectionClosed) {
				// The answer was lost with the connection, not necessarily
				// the write: made, it released a hold, and an error would
				// have the client UNLOCK again and release a second one
				// it still counts on. Made, it is the release.
				resolved := b.resolve(n.path)
				if got, ok := b.applied(ctx, n.path, n.stat.Version, d); ok {
					st, err = got, nil
				}
				resolved()
			}
			if err == nil {
				b.written(n.path, n.data, d, st, leaseKept, time.Time{})
				return true, nil
			}
		}
		gone := false
		switch {
		case errors.Is(err, zk.ErrNoNode):
			gone = true
		case errors.Is(err, zk.ErrBadVersion):
			g, ok, err := b.get(ctx, n.path)
			if err != nil {
				return false, err
			}
			if gone = !ok || g.data.token != token; !gone {
				n.data, n.stat = g.data, g.stat
			}
		default:
			return false, zkErr("unlock", err)
		}
		if gone {
			if !follow {
				b.forget(n.path)
				return false, nil
			}
			var ok bool
			if n, ok, err = b.lookAgain(ctx, n.path, key, token, k); err != nil || !ok {
				return false, err
			}
		}
	}
	return false, errUnhandled
}

// lookAgain forgets the node at path, found gone by a release or renewal
// of token's hold of kind k on key, and looks for the token's node by
// reading the key's children: the node may have been this instance's copy
// of one released since through another instance, and the token may hold
// the key again through a new node.
func (b *Backend) lookAgain(ctx context.Context, path, key, token string, k holdKind) (node, bool, error) {
	b.forget(path)
	n, ok, err := b.findTokenHold(ctx, key, token, k, false)
	if err != nil {
		return node{}, false, fmt.Errorf("zookeeper: looking again for the held node: %w", err)
	}
	return n, ok, nil
}

// Renew resets the lease of the node token holds on key to ttl.
func (b *Backend) Renew(ctx context.Context, key, token string, ttl time.Duration) (time.Duration, error) {
	return b.renew(ctx, key, token, anyHold, ttl)
}

// RenewHold implements backends.HoldKeeper. The lease is raised as a
// reentry raises it: it ends no sooner than it did, nor than ttl after the
// renewal began (lockData.raised); Renew (RENEW) sets it exactly. A
// downgraded token's write and read holds are one node with one lease, and
// a KEEPALIVE watchdog renews every hold of the token, also those taken
// without KEEPALIVE on other connections, whose holders were told of a
// lease of their own: renewing must shorten none of them.
func (b *Backend) RenewHold(ctx context.Context, key, token string, mode backends.Mode, ttl time.Duration) (time.Duration, error) {
	return b.renew(ctx, key, token, kindOf(mode), ttl)
}

// renew resets the lease of the node with token's hold of kind k on key.
func (b *Backend) renew(ctx context.Context, key, token string, k holdKind, ttl time.Duration) (time.Duration, error) {
	if !b.fits(key, 0) {
		return 0, nil // never locked (see fits)
	}
	if err := b.usable(); err != nil {
		return 0, err
	}
	t0 := time.Now()
	n, ok, err := b.findTokenHold(ctx, key, token, k, true)
	if err != nil || !ok {
		return 0, err
	}
	for range maxCAS {
		d := n.data
		if !k.has(d) {
			return 0, nil
		}
		how := leaseSet
		if k != anyHold {
			// RenewHold: not shortening the lease of the token's other
			// holds (the other kind's, or ones its watchdog does not
			// count): raised as a reentry raises it. Restarting it at t0
			// with the longer TTL would not do: a reentry or renewal may
			// have begun its lease after t0.
			d, how = d.raised(n.stat, t0, ttl), leaseRaised
		} else {
			d.ttl, d.startMS = ttl, t0.UnixMilli()
		}
		if err := b.settled(ctx, n.path); err != nil {
			return 0, err
		}
		done := b.changing(n.path)
		st, err := call(ctx, func() (*zk.Stat, error) { return b.conn.Set(n.path, d.encode(), n.stat.Version) })
		if err == nil {
			if b.testBeforeWritten != nil {
				b.testBeforeWritten()
			}
			b.written(n.path, n.data, d, st, how, t0.Add(ttl))
		}
		done()
		switch {
		case err == nil:
			if how == leaseSet {
				b.enforceRenewed(n.path, st.Version, d, t0.Add(ttl))
			}
			// A renewal too late to be of use (a validity under
			// backends.MinValidity) answers 0: the caller must no longer count on
			// the key, which stays held until the lease just set ends.
			return b.validityOf(n, ttl, t0, time.Now()), nil
		case errors.Is(err, zk.ErrNoNode):
			if n, ok, err = b.lookAgain(ctx, n.path, key, token, k); err != nil || !ok {
				return 0, err
			}
		case errors.Is(err, zk.ErrBadVersion):
			g, ok, err := b.get(ctx, n.path)
			if err != nil {
				return 0, err
			}
			if ok && g.data.token == token {
				n.data, n.stat = g.data, g.stat
				continue
			}
			if n, ok, err = b.lookAgain(ctx, n.path, key, token, k); err != nil || !ok {
				return 0, err
			}
		default:
			return 0, zkErr("renew", err)
		}
	}
	return 0, errUnhandled
}

// Info reports key's holders. Their TTLs are what each node's lease
// leaves of the validity it gave (leaseLeft), measured from the lease's
// start as recorded in the node (its mtime for the previous data format)
// against this host's clock.
func (b *Backend) Info(ctx context.Context, key string) (backends.LockInfo, bool, error) {
	if !b.fits(key, 0) {
		return backends.LockInfo{}, false, nil // never locked (see fits)
	}
	if err := b.usable(); err != nil {
		return backends.LockInfo{}, false, err
	}
	dir := keyDir(b.cfg.Root, key)
	// Synced: a follower cut off from its leader serves its clients for a
	// while, and would show holders the ensemble has let go.
	kids, err := b.syncedChildren(ctx, dir)
	if err != nil {
		return backends.LockInfo{}, false, err
	}
	var info backends.LockInfo
	for i, c := range kids {
		g, ok, err := b.get(ctx, dir+"/"+c.name)
		if err != nil {
			return backends.LockInfo{}, false, err
		}
		if !ok {
			continue
		}
		bl, err := b.blocker(ctx, dir, node{idx: i, data: g.data, kids: kids})
		if err != nil {
			return backends.LockInfo{}, false, err
		}
		if bl.name != "" {
			continue
		}
		left := b.leaseLeft(g.data, g.stat, time.Now())
		holds := g.data.read
		if g.data.write > 0 {
			info.Mode, holds = backends.Write, g.data.write
			info.Fence = uint64(g.stat.Czxid)
		} else if len(info.Holders) == 0 {
			info.Mode = backends.Read
		}
		if info.Mode == backends.Read && uint64(g.stat.Czxid) > info.Fence {
			info.Fence = uint64(g.stat.Czxid)
		}
		info.Holders = append(info.Holders, backends.Holder{Token: g.data.token, Holds: holds, TTL: left})
		if len(info.Holders) == 1 || left < info.TTL {
			info.TTL = left
		}
	}
	if len(info.Holders) == 0 {
		return backends.LockInfo{}, false, nil
	}
	b.mu.Lock()
	info.Waiters = b.waiters[key]
	b.mu.Unlock()
	return info, true, nil
}

// forget stops enforcing the lease of a node that is gone or released.
func (b *Backend) forget(path string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if o := b.owned[path]; o != nil {
		b.forgetLocked(o)
	}
}

// forgetLocked drops o; b.mu is held.
func (b *Backend) forgetLocked(o *ownedNode) {
	b.disarmLocked(o)
	if b.owned[o.path] == o {
		delete(b.owned, o.path)
	}
	if k := (heldKey{o.key, o.token}); b.byToken[k] == o {
		delete(b.byToken, k)
	}
}

// armLocked starts o's lease timer, to fire in d; b.mu is held.
func (b *Backend) armLocked(o *ownedNode, d time.Duration) {
	b.armUntilLocked(o, time.Now().Add(d))
}

// armUntilLocked starts o's lease timer, to fire at end; b.mu is held.
func (b *Backend) armUntilLocked(o *ownedNode, end time.Time) {
	o.gen++
	gen := o.gen
	o.end = end
	b.timers.Add(1)
	o.timer = time.AfterFunc(max(time.Until(end), 0), func() {
		defer b.timers.Done()
		b.leaseEnded(o, gen)
	})
}

// disarmLocked stops o's lease timer if it has not fired; b.mu is held.
func (b *Backend) disarmLocked(o *ownedNode) {
	o.gen++
	if o.timer != nil && o.timer.Stop() {
		b.timers.Done()
	}
	o.timer = nil
}

// leaseEnded deletes o's node when its lease ran out without a renewal. A
// change to its data that this instance did not make (a renewal or
// reentry through another instance) restarted the lease: it ends as that
// change stored it (see restartedEnd); one that kept the lease's start and
// TTL (an UNLOCK of one of several holds) leaves it ended. While a
// reentry or renewal made here is in flight it waits (see changing).
func (b *Backend) leaseEnded(o *ownedNode, gen int) {
	ctx, cancel := context.WithTimeout(context.Background(), b.cfg.SessionTimeout)
	defer cancel()
	b.mu.Lock()
	if b.owned[o.path] != o || o.gen != gen || b.closed {
		b.mu.Unlock()
		return
	}
	version, gated := o.version, o.data.hasGate()
	if o.changing > 0 {
		// A reentry or renewal made here is on its way (see changing):
		// its written moves the timer; failed, it leaves it to fire again
		// shortly.
		b.armLocked(o, leaseRetry)
		b.mu.Unlock()
		return
	}
	if !b.connected.Load() {
		// Suspended: the session comes back (then delete) or expires
		// (then the node is gone); sending now would only queue requests.
		b.armLocked(o, leaseRetry)
		b.mu.Unlock()
		return
	}
	b.mu.Unlock()

	err := b.remove(ctx, o.path, version, gated)
	if err == nil && !o.abandoned {
		b.leasesEnded.Add(1)
	}
	switch {
	case err == nil, errors.Is(err, zk.ErrNoNode):
		b.mu.Lock()
		if b.owned[o.path] == o && o.gen == gen {
			b.forgetLocked(o)
		}
		b.mu.Unlock()
		return
	case errors.Is(err, zk.ErrBadVersion):
		g, ok, gerr := b.get(ctx, o.path)
		b.mu.Lock()
		defer b.mu.Unlock()
		if b.owned[o.path] != o || o.gen != gen || b.closed {
			return
		}
		switch {
		case gerr != nil:
			b.armLocked(o, leaseRetry)
		case !ok:
			b.forgetLocked(o)
		case g.data.startMS != 0 && g.data.startMS == o.data.startMS && g.data.ttl == o.data.ttl:
			// The lease was not restarted: delete the node now, as of its
			// new version. Unless the change may be a reentry or renewal
			// made here whose written has yet to come (see changing): the
			// timer then fires again shortly, unless written moves it.
			o.data, o.version, o.mtime = g.data, g.stat.Version, g.stat.Mtime
			if o.changing > 0 {
				b.armLocked(o, leaseRetry)
			} else {
				b.armLocked(o, 0)
			}
		default:
			o.data, o.version, o.mtime = g.data, g.stat.Version, g.stat.Mtime
			b.armUntilLocked(o, restartedEnd(g, time.Now()))
		}
	default:
		// No answer: try again shortly. If the session expires meanwhile
		// the node goes with it.
		b.log.Debug("zookeeper: lease end: delete failed; retrying", zap.Error(err))
		b.mu.Lock()
		defer b.mu.Unlock()
		if b.owned[o.path] == o && o.gen == gen && !b.closed {
			b.armLocked(o, leaseRetry)
		}
	}
}

// restartedEnd is when the lease timer of a node, found at its end with
// data and stat g restarted by a change it did not record, fires next: the
// end of the lease as stored, no sooner than now, and no later than the
// stored TTL from now (a start stored by a host whose clock is ahead of
// this one's). No validity told is cut short: one told here through a
// change the timer recorded ended by now, as the timer never fires before
// it (see written), and one told here through a change it did not record
// (a reentry of a node not yet tracked) ends no later than the lease that
// change stored (raised), on this clock; a reentry or renewal through
// another instance promises nothing (see validityOf), and the lease it
// stored starts before its request, on its host's clock (kept in sync,
// as LOCKINFO and raised need). Counting the whole TTL from now instead
// held the key, its holder gone, until the old lease's end plus the new
// TTL (a reentry elsewhere that lengthened the lease), and up to twice
// the TTL past a renewal elsewhere.
func restartedEnd(g got, now time.Time) time.Time {
	end := later(now, g.data.leaseStart(g.stat).Add(g.data.ttl))
	if limit := now.Add(g.data.ttl); end.After(limit) {
		return limit
	}
	return end
}

// renewedLease is the lease a RENEW through this instance set on a node
// another instance made, enforced here (see enforceRenewed). Guarded by
// Backend.mu.
type renewedLease struct {
	path    string
	version int32 // the node's data version the RENEW wrote, or one since that kept its lease
	gated   bool  // that data has a gate
	// startMS and ttl are the lease the RENEW stored: a change since that
	// keeps them (an UNLOCK of one of several holds) leaves it the node's
	// lease, still enforced here.
	startMS int64
	ttl     time.Duration
	timer   *time.Timer
}

// enforceRenewed enforces the lease a RENEW through this instance set on
// the node at path, when another instance made it (this one's own nodes
// are enforced by their lease timers: see written): at end, the node is
// deleted if its data is still at version, the RENEW's, or if every change
// since kept the lease the RENEW stored (d's start and TTL: a release of
// one of several holds, through any instance), so that no change that
// restarted the lease (a renewal, a reentry that raised it) is overridden.
// The instance that made the node sees the
// RENEW only when its own timer fires, at the end of the lease it knew of
// (then ending it as stored, see restartedEnd): a RENEW that shortened the
// lease would leave the key held until the old lease's end. That instance
// still deletes the node if this one cannot (it closed).
func (b *Backend) enforceRenewed(path string, version int32, d lockData, end time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed || b.owned[path] != nil {
		return
	}
	if r := b.renewed[path]; r != nil {
		b.stopRenewedLocked(r)
		delete(b.renewed, path)
	}
	r := &renewedLease{path: path, version: version, gated: d.hasGate(), startMS: d.startMS, ttl: d.ttl}
	b.renewed[path] = r
	b.armRenewedLocked(r, time.Until(end))
}

// armRenewedLocked starts r's timer, to fire in d; b.mu is held.
func (b *Backend) armRenewedLocked(r *renewedLease, d time.Duration) {
	b.timers.Add(1)
	r.timer = time.AfterFunc(max(d, 0), func() {
		defer b.timers.Done()
		b.renewedEnded(r)
	})
}

// stopRenewedLocked stops r's timer if it has not fired; b.mu is held.
func (b *Backend) stopRenewedLocked(r *renewedLease) {
	if r.timer != nil && r.timer.Stop() {
		b.timers.Done()
	}
	r.timer = nil
}

// renewedEnded deletes r's node if it is still as the RENEW left it.
func (b *Backend) renewedEnded(r *renewedLease) {
	b.mu.Lock()
	if b.renewed[r.path] != r || b.closed {
		b.mu.Unlock()
		return
	}
	if !b.connected.Load() {
		// Suspended, as in leaseEnded.
		b.armRenewedLocked(r, leaseRetry)
		b.mu.Unlock()
		return
	}
	b.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), b.cfg.SessionTimeout)
	defer cancel()
	b.mu.Lock()
	version, gated := r.version, r.gated
	b.mu.Unlock()
	err := b.remove(ctx, r.path, version, gated)
	if err == nil {
		b.leasesEnded.Add(1)
	}
	var g got
	var ok bool
	if errors.Is(err, zk.ErrBadVersion) {
		// Changed since: by a change that restarted the lease (a
		// renewal, a reentry that raised it), whose lease the node's
		// instance enforces, or by one that kept it (an UNLOCK of one of
		// several holds, through any instance), after which the lease
		// is still the one the RENEW set, ended now.
		var gerr error
		if g, ok, gerr = b.get(ctx, r.path); gerr != nil {
			err = gerr
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.renewed[r.path] != r {
		return
	}
	switch {
	case errors.Is(err, zk.ErrBadVersion) && ok && g.data.startMS == r.startMS && g.data.ttl == r.ttl && !b.closed:
		if g.stat.Version == r.version {
			// Read from a server behind the leader's refusal: again shortly.
			b.armRenewedLocked(r, leaseRetry)
			break
		}
		r.version, r.gated = g.stat.Version, g.data.hasGate()
		b.armRenewedLocked(r, 0)
	case err == nil, errors.Is(err, zk.ErrNoNode), errors.Is(err, zk.ErrBadVersion):
		// Deleted; or gone, or its lease restarted since (by a change
		// the node's instance enforces).
		delete(b.renewed, r.path)
	case b.closed:
	default:
		b.log.Debug("zookeeper: renewed lease end: delete failed; retrying", zap.Error(err))
		b.armRenewedLocked(r, leaseRetry)
	}
}

// resolution marks a path while lost answers of hold changes made here
// to it are looked for (see resolve). Guarded by Backend.mu.
type resolution struct {
	n    int           // lost answers being looked for
	done chan struct{} // closed when n drops to 0
}

// resolve marks path while the outcome of a hold change made here, whose
// answer was lost, is looked for (applied), until resolved is called.
// applied finds the write made by the node's next version having its
// data: another change to the node before it looks would leave the
// outcome unknown, answered NOQUORUM, and the client's retry would make
// the change twice (an UNLOCK would release a second hold). The
// reentries, renewals and releases made here, such as a KEEPALIVE
// watchdog's renewal as soon as the session is back, so wait for it
// (settled) before they write.
func (b *Backend) resolve(path string) (resolved func()) {
	b.mu.Lock()
	defer b.mu.Unlock()
	r := b.resolving[path]
	if r == nil {
		r = &resolution{done: make(chan struct{})}
		b.resolving[path] = r
	}
	r.n++
	return func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		if r.n--; r.n == 0 {
			delete(b.resolving, path)
			close(r.done)
		}
	}
}

// settled waits until no lost answer of a hold change made here to path
// is being looked for (see resolve), or ctx is done. A look is bounded by
// a session timeout (applied).
func (b *Backend) settled(ctx context.Context, path string) error {
	for {
		b.mu.Lock()
		r := b.resolving[path]
		b.mu.Unlock()
		if r == nil {
			return nil
		}
		select {
		case <-r.done:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// removedHere reports whether the delete of node n (at its version), whose
// answer was lost with the connection, was made: once the session is back
// on a server synced with the ensemble (for a session timeout at most,
// while ctx lasts), the node, one of this session's, is gone while its
// lease, on the drift-counted clock, still runs. Nothing else deletes such
// a node before its lease ends but this session's expiry (which the wait
// sees) and a release of the same token through another instance, after
// which the hold is released all the same. A node of another instance's
// session goes with that session, whose end this instance cannot see
// (false). A node still there at n's version was not deleted (false:
// the caller's error stands, and the client's retry deletes it); gone
// after its lease may have ended, the delete may have come too late, and
// that is not known (false).
func (b *Backend) removedHere(ctx context.Context, n node) bool {
	if !b.ownSession(n) {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, b.cfg.SessionTimeout)
	defer cancel()
	if !b.backOnSyncedServer(ctx, n.path) {
		return false
	}
	_, ok, err := b.get(ctx, n.path)
	if err != nil || ok {
		return false
	}
	// The lease as stored, less the drift allowance, not capped by the
	// session's horizon as a validity told is: the session is back, so
	// it did not end.
	ttl := n.data.ttl
	end := n.data.leaseStart(n.stat).Add(ttl - time.Duration(float64(ttl)*b.cfg.DriftFactor) - b.cfg.DriftMin)
	return time.Now().Before(end)
}

// backOnSyncedServer waits, while ctx lasts, until the session is back on
// a server and that server is synced with the ensemble for path (the
// session may come back on one that has not applied a write yet: see
// abandonByNonce); false when ctx ends or the session expires first.
func (b *Backend) backOnSyncedServer(ctx context.Context, path string) bool {
	b.mu.Lock()
	expired := b.expired
	b.mu.Unlock()
	for !b.connected.Load() {
		select {
		case <-ctx.Done():
			return false
		case <-expired:
			return false
		case <-time.After(20 * time.Millisecond):
		}
	}
	if b.testBeforeApplied != nil {
		b.testBeforeApplied()
	}
	_, err := call(ctx, func() (string, error) { return b.conn.Sync(path) })
	return err == nil
}

// applied reports whether the write of d to the node at path at data
// version version, whose answer was lost with the connection, was made,
// and the node's stat after it: once the session is back on a server (for
// a session timeout at most, while ctx lasts) and that server is synced
// with the ensemble, the node has version+1 and data d. When it has
// version, the write was not made; when it changed again since, or the
// session did not come back in time, it is not known: false either way.
func (b *Backend) applied(ctx context.Context, path string, version int32, d lockData) (*zk.Stat, bool) {
	ctx, cancel := context.WithTimeout(ctx, b.cfg.SessionTimeout)
	defer cancel()
	if !b.backOnSyncedServer(ctx, path) {
		return nil, false
	}
	g, ok, err := b.get(ctx, path)
	if err != nil || !ok || g.stat.Version != version+1 || g.data != d {
		return nil, false
	}
	return g.stat, true
}
