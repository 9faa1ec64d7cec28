package redis

import (
	"cmp"
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// Timings of a node's release subscription.
const (
	// subscribePingEvery is how long the subscription may stay silent
	// before it sends a PING, whose answer must come within the node
	// timeout: a connection lost without a reset (a partition, a NAT or
	// firewall that forgot it) is then found and redialed within about
	// this long.
	subscribePingEvery = 30 * time.Second
	// subscribeRetryMin and subscribeRetryMax bound the pause before
	// redialing a node whose subscription connection failed: a node that is
	// down must not be dialed in a tight loop, and missed releases meanwhile
	// are found by the waiters' jittered retry.
	subscribeRetryMin = 100 * time.Millisecond
	subscribeRetryMax = 2 * time.Second
)

// subscriber listens on one node for releases of the keys that local
// waiters contend for (see waitQueues). The release script publishes on <prefix>released:<key> whenever
// it deletes a lock, so a release made through any lockproxy instance wakes
// the waiters here. It holds one go-redis PubSub (one connection); a
// message that is missed (the subscription not active yet, the node down)
// costs the waiter only its retry delay. A release that is never
// published (a lock key deleted in transparent mode or by hand, a node
// user allowed SUBSCRIBE but denied PUBLISH, which the release script's
// pcall hides) is found by a waiter that sleeps on a lease within
// Backend.leaseSleepMax.
type subscriber struct {
	ps        *goredis.PubSub
	prefix    string // <node prefix>released:
	timeout   time.Duration
	pingEvery time.Duration         // subscribePingEvery
	wanted    func(key string) bool // whether key is watched by local waiters
	wake      func(key string)      // a release of key was seen
	// live, when set, learns each subscription the node confirmed (on
	// true) or ended (on false); lost, that the connection failed, and
	// every subscription on it with it, until go-redis has subscribed
	// again on a new one (confirmed again through live). A waiter relies
	// on announcements only while its key's subscription is live.
	live func(key string, on bool)
	lost func()

	mu    sync.Mutex
	dirty map[string]struct{} // keys whose subscription may need a change
	kick  chan struct{}       // buffered 1: dirty is not empty
	stop  chan struct{}
	done  chan struct{} // closed when run has returned

	// ctx is the PubSub calls' context: it names the subscriber to the
	// node's dialer (subscriberKey, dialed), and close cancels it.
	ctx    context.Context
	cancel context.CancelFunc
	// conn is the connection last dialed for the PubSub, which close
	// closes: go-redis holds the PubSub's lock while it connects, and
	// reads a node that accepted the connection but does not answer (a
	// frozen host) until its read timeouts pass, seconds; PubSub.Close
	// would wait for that, and so would lockproxy's exit. connStopped: no
	// connection may be made any more.
	connMu      sync.Mutex
	conn        net.Conn
	connStopped bool
}

// subscriberKey is the context key of a subscriber's PubSub calls (see
// subscriber.ctx).
type subscriberKey struct{}

// dialed takes in nc, a connection just dialed for s's PubSub. It is
// refused once s is closing.
func (s *subscriber) dialed(nc net.Conn) error {
	s.connMu.Lock()
	defer s.connMu.Unlock()
	if s.connStopped {
		return errClosed
	}
	s.conn = nc
	return nil
}

func newSubscriber(n *Node, wanted func(string) bool, wake func(string)) *subscriber {
	return newSubscriberLive(n, wanted, wake, nil, nil)
}

// newSubscriberLive is newSubscriber that also reports which
// subscriptions are live (see subscriber.live and lost).
func newSubscriberLive(n *Node, wanted func(string) bool, wake func(string), live func(string, bool), lost func()) *subscriber {
	s := &subscriber{
		ps:        n.client.Subscribe(context.Background()),
		prefix:    n.prefix + "released:",
		timeout:   n.timeout,
		pingEvery: cmp.Or(n.subscribePing, subscribePingEvery),
		wanted:    wanted,
		wake:      wake,
		live:      live,
		lost:      lost,
		dirty:     map[string]struct{}{},
		kick:      make(chan struct{}, 1),
		stop:      make(chan struct{}),
		done:      make(chan struct{}),
	}
	s.ctx, s.cancel = context.WithCancel(context.WithValue(context.Background(), subscriberKey{}, s))
	go s.run()
	return s
}

// channel is the channel the release script publishes key's releases on.
func (s *subscriber) channel(key string) string { return s.prefix + key }

// update asks the subscriber to subscribe to key's channel, or to
// unsubscribe, whichever wanted(key) says when it gets to it. It does no
// I/O and never blocks.
func (s *subscriber) update(key string) {
	s.mu.Lock()
	s.dirty[key] = struct{}{}
	s.mu.Unlock()
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// close stops the subscriber and waits for its goroutines.
func (s *subscriber) close() {
	select {
	case <-s.stop:
	default:
		close(s.stop)
	}
	// An attempt to connect under way ends now, not on its timeouts.
	s.cancel()
	s.connMu.Lock()
	s.connStopped = true
	if s.conn != nil {
		_ = s.conn.Close()
	}
	s.connMu.Unlock()
	<-s.done
}

// run applies subscription changes until close, then closes the PubSub and
// waits for the receiver, which ends with it.
func (s *subscriber) run() {
	defer close(s.done)
	received := make(chan struct{})
	go s.receive(received)
	active := map[string]struct{}{}
	var sub, unsub []string
	for {
		select {
		case <-s.stop:
			_ = s.ps.Close()
			<-received
			return
		case <-s.kick:
		}
		s.mu.Lock()
		dirty := s.dirty
		s.dirty = make(map[string]struct{}, len(dirty))
		s.mu.Unlock()
		sub, unsub = sub[:0], unsub[:0]
		for key := range dirty {
			_, have := active[key]
			switch want := s.wanted(key); {
			case want && !have:
				active[key] = struct{}{}
				sub = append(sub, s.channel(key))
			case !want && have:
				delete(active, key)
				unsub = append(unsub, s.channel(key))
			}
		}
		// Errors need no handling: go-redis keeps the channel set and
		// subscribes again when the receiver reconnects.
		ctx, cancel := context.WithTimeout(s.ctx, s.timeout)
		if len(unsub) > 0 {
			_ = s.ps.Unsubscribe(ctx, unsub...)
		}
		if len(sub) > 0 {
			_ = s.ps.Subscribe(ctx, sub...)
		}
		cancel()
	}
}

// receive reads messages until the PubSub is closed.
func (s *subscriber) receive(done chan<- struct{}) {
	defer close(done)
	pause := subscribeRetryMin
	pinged := false // a PING went out after a silence; its answer is due
	for {
		var msg any
		var err error
		if pinged {
			// The PING's answer (or any message) must come within the
			// node timeout (at least a second). Read with no timeout of go-redis's own, a
			// read deadline passing counts as a bad connection, which
			// go-redis closes and redials: a write into a connection
			// that a partition or a forgetful NAT left open succeeds, so
			// only the missing answer tells.
			ctx, cancel := context.WithTimeout(s.ctx, max(s.timeout, time.Second))
			msg, err = s.ps.ReceiveTimeout(ctx, 0)
			cancel()
		} else {
			msg, err = s.ps.ReceiveTimeout(s.ctx, s.pingEvery)
		}
		select {
		case <-s.stop:
			return
		default:
		}
		var ne net.Error
		if err != nil && !pinged && errors.As(err, &ne) && ne.Timeout() {
			// Silence: make sure the connection is alive.
			ctx, cancel := context.WithTimeout(s.ctx, s.timeout)
			err = s.ps.Ping(ctx)
			cancel()
			pinged = err == nil // a failed write makes go-redis redial
			if err != nil {
				s.connLost()
			}
			continue
		}
		pinged = false
		if err != nil {
			s.connLost()
			t := time.NewTimer(pause)
			select {
			case <-s.stop:
				t.Stop()
				return
			case <-t.C:
			}
			pause = min(pause*2, subscribeRetryMax)
			continue
		}
		pause = subscribeRetryMin
		switch m := msg.(type) {
		case *goredis.Message:
			if key, ok := strings.CutPrefix(m.Channel, s.prefix); ok {
				s.wake(key)
			}
		case *goredis.Subscription:
			// The node's confirmation: from now on it publishes the
			// key's releases to us (or, unsubscribed, no longer).
			if key, ok := strings.CutPrefix(m.Channel, s.prefix); ok && s.live != nil {
				s.live(key, m.Kind == "subscribe")
			}
		}
	}
}

// connLost reports that the subscription connection failed.
func (s *subscriber) connLost() {
	if s.lost != nil {
		s.lost()
	}
}
