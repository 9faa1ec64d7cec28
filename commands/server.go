package commands

import (
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/lockproxy/lockproxy/quorum"
	"github.com/lockproxy/lockproxy/relay"
	"github.com/lockproxy/lockproxy/resp"
)

// redisCompatVersion is the Redis version lockproxy's own command surface
// matches; clients read it from HELLO and INFO to pick features.
const redisCompatVersion = "7.2.0"

func isNoQuorum(err error) bool { return errors.Is(err, quorum.ErrNoQuorum) }

func (h *Handler) ping(s *resp.Session, args [][]byte) {
	switch len(args) {
	case 1:
		s.W.Simple("PONG")
	case 2:
		s.W.Bulk(args[1])
	default:
		wrongArity(s, "ping")
	}
}

func (h *Handler) echo(s *resp.Session, args [][]byte) { s.W.Bulk(args[1]) }

func (h *Handler) quit(s *resp.Session, args [][]byte) {
	s.W.Simple("OK")
	s.CloseAfterReply()
}

// auth: AUTH [username] password. The default user's password is
// auth.password, named users are auth.users; AUTH password without either
// configured gets the error Redis gives.
func (h *Handler) auth(s *resp.Session, args [][]byte) {
	if len(args) > 3 {
		s.W.Error("ERR syntax error")
		return
	}
	if len(args) == 2 && h.password == "" {
		s.W.Error("ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?")
		return
	}
	user, pass := []byte("default"), args[len(args)-1]
	if len(args) == 3 {
		user = args[1]
	}
	if !h.authRequired() {
		// Like Redis's default user with nopass: any password does for
		// it, and there is no other user.
		if string(user) != "default" {
			s.W.Error(errWrongPass)
			return
		}
		s.W.Simple("OK")
		return
	}
	if !h.checkPassword(s, user, pass) {
		// As in Redis, a failed AUTH leaves the connection as it was.
		return
	}
	h.signIn(s, user)
	s.W.Simple("OK")
}

// checkPassword reports whether pass is user's password. When it is not,
// it writes the error: WRONGPASS, or, once failures from the client's
// address exceed authFailRate a second (beyond a burst), an error that
// says to slow down, without comparing the password at all, so that one
// address guesses at that rate however many connections it opens, and
// clients elsewhere are not held back by it.
func (h *Handler) checkPassword(s *resp.Session, user, pass []byte) bool {
	from := clientHost(s.RemoteAddr())
	if !h.authFail.allowed(from, time.Now()) {
		h.metrics.authThrottled.Inc()
		s.W.Error(errAuthThrottled)
		return false
	}
	if h.passwordOK(user, pass) {
		return true
	}
	h.authFail.failed(from, time.Now())
	h.metrics.wrongPassword.Inc()
	s.W.Error(errWrongPass)
	return false
}

// clientHost is what failed passwords are counted by: the client's IP
// address, and for IPv6 its /64, which one host usually has whole.
func clientHost(addr string) string {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return host
	}
	if ip.Is6() && !ip.Is4In6() {
		if p, err := ip.Prefix(64); err == nil {
			return p.String()
		}
	}
	return ip.Unmap().String()
}

const errAuthThrottled = "ERR too many failed authentication attempts from this address; try again in a second"

// Failed authentications allowed per client address: a burst, then a
// steady rate.
const (
	authFailRate  = 10
	authFailBurst = 20
	// authFailAddrs bounds the addresses tracked. Past it, failures from
	// new addresses are not counted until old ones are paid back: a
	// guesser with that many addresses is not held back, but neither is
	// any client with the right password (a shared budget would let the
	// guesser lock everyone out).
	authFailAddrs = 4096
	// authSweepEvery bounds how often a full table is swept for paid-back
	// addresses: each sweep walks it all, under the lock, on the caller's
	// goroutine (the event loop's, for AUTH and HELLO).
	authSweepEvery = 100 * time.Millisecond
)

// authLimiter keeps a token bucket of failed authentications per client
// address; an address has one only while it owes failures.
type authLimiter struct {
	mu        sync.Mutex
	m         map[string]*authBucket
	lastSweep time.Time
}

type authBucket struct {
	spent float64 // failures not yet paid back
	last  time.Time
}

// paidBack pays back what the time since the bucket's last use earned.
func (b *authBucket) paidBack(now time.Time) {
	b.spent = max(0, b.spent-now.Sub(b.last).Seconds()*authFailRate)
	b.last = now
}

// allowed tells whether an attempt from from may be checked now.
func (a *authLimiter) allowed(from string, now time.Time) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	b := a.m[from]
	if b == nil {
		return true
	}
	b.paidBack(now)
	return b.spent < authFailBurst
}

// failed records a failed attempt from from.
func (a *authLimiter) failed(from string, now time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	b := a.m[from]
	if b == nil {
		if a.m == nil {
			a.m = make(map[string]*authBucket)
		}
		if len(a.m) >= authFailAddrs && now.Sub(a.lastSweep) >= authSweepEvery {
			a.lastSweep = now
			for k, old := range a.m {
				if old.paidBack(now); old.spent == 0 {
					delete(a.m, k)
				}
			}
		}
		if len(a.m) >= authFailAddrs {
			return
		}
		b = &authBucket{last: now}
		a.m[from] = b
	}
	b.paidBack(now)
	b.spent++
}

// authRequired tells whether clients must authenticate (auth.password or
// auth.users is set).
func (h *Handler) authRequired() bool { return h.password != "" || len(h.users) > 0 }

func (h *Handler) signIn(s *resp.Session, user []byte) {
	c := state(s)
	c.authed = true
	c.user = string(user)
	c.perm = h.perms[c.user]
	s.SetAuthenticated(true)
}

// userName is the user the connection acts as, for CLIENT INFO and LIST.
func userName(c *conn) string {
	if c.authed && c.user != "" {
		return c.user
	}
	return "default"
}

const errWrongPass = "WRONGPASS invalid username-password pair or user is disabled."

// passwordOK reports whether pass is user's password, in a time that
// tells neither the password nor whether the user exists (passwordMatch).
// The default user has a password only when auth.password is set.
func (h *Handler) passwordOK(user, pass []byte) bool {
	want, ok := h.password, h.password != ""
	if string(user) != "default" {
		want, ok = h.users[string(user)]
	}
	return passwordMatch(pass, want, ok)
}

// unknownUser is hashed in place of the password of a user that does not
// exist, so that such a user costs the same work as one that does.
const unknownUser = "lockproxy: no such user"

// passwordMatch reports whether given is want, the password of a user that
// exists when known. It compares SHA-256 digests in constant time: a
// client must not learn the password a byte at a time from how long the
// answer takes, and subtle.ConstantTimeCompare returns at once when the
// lengths differ, which would give the password's length away; digests
// are always 32 bytes. An unknown user's password is a fixed dummy, and the
// same hashing and comparison run, so that the time does not tell a
// missing user from a wrong password either.
func passwordMatch(given []byte, want string, known bool) bool {
	if !known {
		want = unknownUser
	}
	wantSum := sha256.Sum256([]byte(want))
	givenSum := sha256.Sum256(given)
	knownBit := 0
	if known {
		knownBit = 1
	}
	return subtle.ConstantTimeCompare(givenSum[:], wantSum[:])&knownBit == 1
}

// noAuthNeeded are the commands Redis serves before AUTH.
func noAuthNeeded(cmd []byte) bool {
	for _, c := range []string{"AUTH", "HELLO", "QUIT", "RESET"} {
		if resp.EqualFold(cmd, c) {
			return true
		}
	}
	return false
}

func (h *Handler) selectDB(s *resp.Session, args [][]byte) {
	n, ok := resp.ParseInt(args[1])
	switch {
	case !ok:
		s.W.Error(errNotInteger.Error())
	case n != 0:
		s.W.Error("ERR DB index is out of range")
	default:
		s.W.Simple("OK")
	}
}

// hello: HELLO [protover [AUTH username password] [SETNAME clientname]]
func (h *Handler) hello(s *resp.Session, args [][]byte) {
	proto := s.W.Proto()
	if len(args) >= 2 {
		v, ok := resp.ParseInt(args[1])
		if !ok {
			s.W.Error("ERR Protocol version is not an integer or out of range")
			return
		}
		if v != 2 && v != 3 {
			s.W.Error("NOPROTO unsupported protocol version")
			return
		}
		proto = int(v)
	}
	var name, user, pass []byte
	for i := 2; i < len(args); i++ {
		switch {
		case resp.EqualFold(args[i], "AUTH") && i+2 < len(args):
			user, pass = args[i+1], args[i+2]
			i += 2
		case resp.EqualFold(args[i], "SETNAME") && i+1 < len(args):
			name = args[i+1]
			if !validClientName(name) {
				s.W.Error("ERR Client names cannot contain spaces, newlines or special characters.")
				return
			}
			i++
		default:
			s.W.Error("ERR Syntax error in HELLO option '" + relay.Clip(string(args[i])) + "'")
			return
		}
	}
	// As in Redis 7.2's helloCommand, the credentials are checked only
	// once the version and every option are found right (a HELLO that
	// answers an error signs nobody in), and a HELLO is refused for being
	// unauthenticated only after that: a client probing for a protocol
	// is told NOPROTO first.
	if user != nil {
		// Without auth.password or auth.users, like Redis's default
		// user with nopass, any password is accepted for "default",
		// the only user there is (as AUTH takes them).
		switch {
		case h.authRequired():
			if !h.checkPassword(s, user, pass) {
				return
			}
			h.signIn(s, user)
		case string(user) != "default":
			s.W.Error(errWrongPass)
			return
		}
	}
	if h.authRequired() && !state(s).authed {
		s.W.Error("NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time")
		return
	}
	if c, ok := s.Data.(*conn); ok && c.rl != nil && !h.pinnedHello(s, c.rl, proto) {
		return
	}
	if name != nil {
		state(s).name = string(name)
		s.SetName(string(name))
	}
	s.SetProto(proto)
	if c, ok := s.Data.(*conn); ok && c.ka != nil {
		c.ka.proto.Store(int32(proto))
	}
	s.W.Map(7)
	s.W.BulkString("server")
	s.W.BulkString("redis")
	s.W.BulkString("version")
	s.W.BulkString(redisCompatVersion)
	s.W.BulkString("proto")
	s.W.Int(int64(proto))
	s.W.BulkString("id")
	s.W.Int(s.ID())
	s.W.BulkString("mode")
	s.W.BulkString("standalone")
	s.W.BulkString("role")
	s.W.BulkString("master")
	s.W.BulkString("modules")
	s.W.Array(0)
}

func validClientName(name []byte) bool {
	for _, c := range name {
		if c < '!' || c > '~' {
			return false
		}
	}
	return true
}

func (h *Handler) clientID(s *resp.Session, args [][]byte) { s.W.Int(s.ID()) }

func (h *Handler) clientSetName(s *resp.Session, args [][]byte) {
	if !validClientName(args[2]) {
		s.W.Error("ERR Client names cannot contain spaces, newlines or special characters.")
		return
	}
	state(s).name = string(args[2])
	s.SetName(string(args[2]))
	s.W.Simple("OK")
}

func (h *Handler) clientGetName(s *resp.Session, args [][]byte) {
	if n := state(s).name; n != "" {
		s.W.BulkString(n)
		return
	}
	s.W.Null()
}

func (h *Handler) clientSetInfo(s *resp.Session, args [][]byte) {
	c := state(s)
	switch {
	case resp.EqualFold(args[2], "LIB-NAME"):
		if !validClientName(args[3]) {
			s.W.Error("ERR lib-name cannot contain spaces, newlines or special characters.")
			return
		}
		c.libName = string(args[3])
	case resp.EqualFold(args[2], "LIB-VER"):
		if !validClientName(args[3]) {
			s.W.Error("ERR lib-ver cannot contain spaces, newlines or special characters.")
			return
		}
		c.libVer = string(args[3])
	default:
		s.W.Error("ERR Unrecognized option '" + relay.Clip(string(args[2])) + "'")
		return
	}
	s.W.Simple("OK")
}

func clientLine(s *resp.Session, now time.Time) string {
	c := state(s)
	// Redis names a subcommand "client|list"; the metric label that
	// lastCmd holds is "client_list" (no command name has a "_").
	return fmt.Sprintf("id=%d addr=%s laddr=%s name=%s age=%d idle=%d db=0 omem=%d cmd=%s user=%s resp=%d lib-name=%s lib-ver=%s",
		s.ID(), s.RemoteAddr(), s.LocalAddr(), c.name,
		int64(now.Sub(s.Created()).Seconds()), int64(now.Sub(s.LastActive()).Seconds()), s.OutputBytes(),
		strings.Replace(c.lastCmd, "_", "|", 1), userName(c), s.W.Proto(), c.libName, c.libVer)
}

// otherClientLine is CLIENT LIST's line for another connection than the
// caller's: that connection's state belongs to its goroutine, so it shows
// only what is safe to read from here.
func otherClientLine(s *resp.Session, now time.Time) string {
	return fmt.Sprintf("id=%d addr=%s laddr=%s name=%s age=%d idle=%d db=0 omem=%d",
		s.ID(), s.RemoteAddr(), s.LocalAddr(), s.Name(),
		int64(now.Sub(s.Created()).Seconds()), int64(now.Sub(s.LastActive()).Seconds()), s.OutputBytes())
}

func (h *Handler) clientInfo(s *resp.Session, args [][]byte) {
	s.W.Verbatim(clientLine(s, time.Now()) + "\n")
}

// clientList: CLIENT LIST [TYPE normal|master|replica|pubsub] | [ID id
// [id ...]], parsed as Redis 7 does (one filter or none), with its
// errors: libraries look a connection up with CLIENT LIST ID, and count
// subscribers with TYPE pubsub. lockproxy has no master or replica
// connections; a subscribed one is pubsub, any other normal.
func (h *Handler) clientList(s *resp.Session, args [][]byte) {
	kind := "" // a TYPE filter
	var ids []int64
	switch {
	case len(args) == 4 && resp.EqualFold(args[2], "TYPE"):
		switch kind = strings.ToLower(string(args[3])); kind {
		case "normal", "pubsub", "master":
		case "replica", "slave":
			kind = "replica"
		default:
			s.W.Error("ERR Unknown client type '" + relay.Clip(string(args[3])) + "'")
			return
		}
	case len(args) > 3 && resp.EqualFold(args[2], "ID"):
		for _, a := range args[3:] {
			id, ok := resp.ParseInt(a)
			if !ok {
				s.W.Error("ERR Invalid client ID")
				return
			}
			ids = append(ids, id)
		}
	case len(args) != 2:
		s.W.Error("ERR syntax error")
		return
	}
	sessions := []*resp.Session{s}
	if h.clients != nil {
		sessions = h.clients()
	}
	now := time.Now()
	var b strings.Builder
	line := func(other *resp.Session) {
		if other == s {
			b.WriteString(clientLine(s, now))
		} else {
			b.WriteString(otherClientLine(other, now))
		}
		b.WriteByte('\n')
	}
	if ids != nil {
		// In the order asked, as Redis lists them; unknown ids are left
		// out.
		byID := make(map[int64]*resp.Session, len(sessions))
		for _, other := range sessions {
			byID[other.ID()] = other
		}
		for _, id := range ids {
			if other := byID[id]; other != nil {
				line(other)
			}
		}
		s.W.Verbatim(b.String())
		return
	}
	for _, other := range sessions {
		if kind == "" || kind == "normal" && !other.PubSub() || kind == "pubsub" && other.PubSub() {
			line(other)
		}
	}
	s.W.Verbatim(b.String())
}

// clientNoop is CLIENT NO-EVICT and NO-TOUCH, which take ON or OFF as in
// Redis and change nothing: lockproxy evicts no clients, and keeps no LRU
// clock to spare.
func (h *Handler) clientNoop(s *resp.Session, args [][]byte) {
	if !resp.EqualFold(args[2], "ON") && !resp.EqualFold(args[2], "OFF") {
		s.W.Error("ERR syntax error")
		return
	}
	s.W.Simple("OK")
}

// info: INFO [section ...]
func (h *Handler) infoCmd(s *resp.Session, args [][]byte) {
	want := map[string]bool{}
	for _, a := range args[1:] {
		want[strings.ToLower(string(a))] = true
	}
	all := len(want) == 0 || want["all"] || want["everything"] || want["default"]
	var b strings.Builder
	section := func(name string, body func()) {
		if all || want[strings.ToLower(name)] {
			if b.Len() > 0 {
				b.WriteString("\r\n")
			}
			b.WriteString("# " + name + "\r\n")
			body()
		}
	}
	kv := func(k string, v any) { fmt.Fprintf(&b, "%s:%v\r\n", k, v) }
	up := time.Since(h.started)
	section("Server", func() {
		kv("redis_version", redisCompatVersion)
		kv("redis_mode", "standalone")
		kv("lockproxy_version", h.info.Version)
		kv("lockproxy_git_sha1", h.info.Commit)
		kv("os", runtime.GOOS+" "+runtime.GOARCH)
		kv("arch_bits", strconv.Itoa(strconv.IntSize))
		kv("multiplexing_api", "go")
		kv("go_version", runtime.Version())
		kv("process_id", os.Getpid())
		kv("run_id", h.runID)
		kv("tcp_port", h.info.Port)
		kv("uptime_in_seconds", int64(up.Seconds()))
		kv("uptime_in_days", int64(up.Hours()/24))
		kv("config_file", h.info.ConfigFile)
	})
	section("Clients", func() {
		n := 0
		if h.clients != nil {
			n = len(h.clients())
		}
		kv("connected_clients", n)
		blocked := 0
		if w, ok := h.backend.(waiting); ok {
			blocked = w.Waiting()
		}
		kv("blocked_clients", blocked)
	})
	section("Lockproxy", func() {
		kv("lockproxy_backend", h.info.Backend)
		kv("lockproxy_dev_mode", boolInt(h.info.Dev))
		kv("lockproxy_nodes", len(h.info.Nodes))
		kv("lockproxy_quorum", len(h.info.Nodes)/2+1)
		kv("lockproxy_node_addrs", strings.Join(h.info.Nodes, ","))
		kv("lockproxy_default_ttl_ms", h.limits.DefaultTTL.Milliseconds())
		kv("lockproxy_max_ttl_ms", h.limits.MaxTTL.Milliseconds())
		kv("lockproxy_locks_held", h.held.count())
		kv("lockproxy_keepalive_locks", h.keepalive.count())
		kv("lockproxy_keepalive_idle_ms", h.keepalive.idle.Milliseconds())
		// Threads running Go code now (procs: auto changes it with the load).
		kv("lockproxy_procs", runtime.GOMAXPROCS(0))
		if h.loopStats != nil {
			on, off, back := h.loopStats()
			kv("lockproxy_event_loop_clients", on)
			kv("lockproxy_event_loop_handoffs", off)
			kv("lockproxy_event_loop_returns", back)
		}
		if ns, ok := h.backend.(nodeStates); ok {
			for i, st := range ns.NodeStates() {
				kv("lockproxy_node"+strconv.Itoa(i), st)
			}
		}
	})
	s.W.Verbatim(b.String())
}

// waiting is a backend that counts the LOCK … WAIT calls it has queued,
// which INFO reports as blocked_clients, as Redis does for its blocking
// commands.
type waiting interface {
	Waiting() int
}

// nodeStates is a backend that describes each of its nodes in one line of
// comma-separated key=value pairs, which INFO reports as lockproxy_node<i>.
type nodeStates interface {
	NodeStates() []string
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
