//go:build linux

package harness

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

const (
	// zkJar is Debian's zookeeper package's server jar; its manifest's
	// Class-Path names every dependency, so it is the whole class path.
	zkJar = "/usr/share/java/zookeeper.jar"
	// zkStartupWait bounds a server's start: a JVM serves in 0.5–2 s on an
	// idle machine, much later on a loaded one.
	zkStartupWait = 60 * time.Second
	// ZKTick is the servers' tickTime. Sessions may time out between 2 and
	// 120 ticks (1–60 s), so tests can expire sessions quickly.
	ZKTick = 500 * time.Millisecond
)

// ZooKeeper is one ZooKeeper server child process on 127.0.0.1, standalone
// or a member of an ensemble.
type ZooKeeper struct {
	Port int
	Addr string // "127.0.0.1:port"

	dir  string
	args []string

	mu  sync.Mutex
	cur *child
}

// StartZooKeeper starts a standalone ZooKeeper server (see LaunchZooKeeper)
// and registers a cleanup that kills and reaps it.
func StartZooKeeper(t testing.TB) *ZooKeeper {
	t.Helper()
	z, err := LaunchZooKeeper(t.TempDir())
	if err != nil {
		t.Fatalf("harness: %v", err)
	}
	t.Cleanup(z.Kill)
	return z
}

// StartZooKeeperEnsemble starts n servers forming one ensemble (see
// LaunchZooKeeperEnsemble) and registers a cleanup that kills them.
func StartZooKeeperEnsemble(t testing.TB, n int) []*ZooKeeper {
	t.Helper()
	zs, err := LaunchZooKeeperEnsemble(t.TempDir(), n)
	if err != nil {
		t.Fatalf("harness: %v", err)
	}
	t.Cleanup(func() {
		for _, z := range zs {
			z.Kill()
		}
	})
	return zs
}

// ZKAddrs returns the servers' host:port addresses.
func ZKAddrs(zs []*ZooKeeper) []string {
	out := make([]string, len(zs))
	for i, z := range zs {
		out[i] = z.Addr
	}
	return out
}

// LaunchZooKeeper starts a standalone server with its data under dir
// (which must exist), on a free loopback port, with the admin server off
// (it would listen on 8080 on every interface) and the four-letter words
// srvr, ruok and mntr allowed; it waits until the server serves. The
// caller must Kill it: it is for servers shared by the tests of a package
// (started in TestMain), where no testing.TB lives long enough.
func LaunchZooKeeper(dir string) (*ZooKeeper, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	z := &ZooKeeper{Port: port, Addr: fmt.Sprintf("127.0.0.1:%d", port), dir: dir}
	cfg := z.baseConfig()
	if err := os.WriteFile(filepath.Join(dir, "zoo.cfg"), []byte(cfg), 0o644); err != nil {
		return nil, err
	}
	z.args = z.javaArgs("org.apache.zookeeper.server.ZooKeeperServerMain")
	if err := z.launch(); err != nil {
		return nil, err
	}
	if err := z.waitServing(zkStartupWait); err != nil {
		z.Kill()
		return nil, err
	}
	return z, nil
}

// LaunchZooKeeperEnsemble starts n servers (each in a subdirectory of dir)
// that form one ensemble, and waits until each serves as leader or
// follower. The caller must Kill them.
func LaunchZooKeeperEnsemble(dir string, n int) ([]*ZooKeeper, error) {
	zs, _, err := launchEnsemble(dir, n, false)
	return zs, err
}

// LaunchZooKeeperEnsembleLinked is LaunchZooKeeperEnsemble with every
// connection between two servers made through a Link (PeerLinks), so that
// a test can cut one server off from the rest of the ensemble while its
// clients still reach it. The caller must Kill the servers and Close the
// links.
func LaunchZooKeeperEnsembleLinked(dir string, n int) ([]*ZooKeeper, *PeerLinks, error) {
	return launchEnsemble(dir, n, true)
}

// PeerLinks are the links between the servers of a linked ensemble: each
// server reaches each other one's quorum and election ports through links
// of its own (server i's configuration names them in place of the others'
// ports), so the links that carry a server's traffic with its peers are
// those it dials and those its peers dial to it.
type PeerLinks struct {
	of  [][]*Link // of[i]: every link that carries server i's peer traffic
	all []*Link
}

// Cut drops every byte between server i (from 0) and the rest of the
// ensemble, both ways, on open and new connections (see Link.Cut).
func (p *PeerLinks) Cut(i int) {
	for _, l := range p.of[i] {
		l.Cut()
	}
}

// Heal lets server i's peer traffic through again (see Link.Heal).
func (p *PeerLinks) Heal(i int) {
	for _, l := range p.of[i] {
		l.Heal()
	}
}

// Close stops every link.
func (p *PeerLinks) Close() {
	for _, l := range p.all {
		l.Close()
	}
}

func launchEnsemble(dir string, n int, linked bool) ([]*ZooKeeper, *PeerLinks, error) {
	zs := make([]*ZooKeeper, n)
	peerPorts := make([][2]int, n) // quorum, election
	for i := range zs {
		ports := make([]int, 3)
		for j := range ports {
			p, err := freePort()
			if err != nil {
				return nil, nil, err
			}
			ports[j] = p
		}
		sub := filepath.Join(dir, fmt.Sprintf("zk%d", i+1))
		if err := os.MkdirAll(filepath.Join(sub, "data"), 0o755); err != nil {
			return nil, nil, err
		}
		zs[i] = &ZooKeeper{Port: ports[0], Addr: fmt.Sprintf("127.0.0.1:%d", ports[0]), dir: sub}
		peerPorts[i] = [2]int{ports[1], ports[2]}
	}
	// views[i] is the server list in server i's configuration.
	views := make([][][2]int, n)
	var links *PeerLinks
	var electionLinks [][3]int // i, j, index in links.all of i's election link to j
	fail := func(err error) ([]*ZooKeeper, *PeerLinks, error) {
		if links != nil {
			links.Close()
		}
		return nil, nil, err
	}
	if linked {
		links = &PeerLinks{of: make([][]*Link, n)}
	}
	for i := range zs {
		views[i] = make([][2]int, n)
		for j := range zs {
			if !linked || i == j {
				views[i][j] = peerPorts[j]
				continue
			}
			for k := range 2 {
				l, err := newLink(fmt.Sprintf("127.0.0.1:%d", peerPorts[j][k]))
				if err != nil {
					return fail(err)
				}
				links.all = append(links.all, l)
				links.of[i] = append(links.of[i], l)
				links.of[j] = append(links.of[j], l)
				views[i][j][k] = l.ln.Addr().(*net.TCPAddr).Port
				if k == 1 {
					electionLinks = append(electionLinks, [3]int{i, j, len(links.all) - 1})
				}
			}
		}
	}
	// A server that receives an election connection from a server with a
	// lower id closes it and connects back, to the election address the
	// other sent in its first message (its own, the real port), not to
	// the one its configuration names: the link from server i to server
	// j puts in that address the port of j's link to i, or the cut would
	// miss the connections made back.
	for _, e := range electionLinks {
		i, j, l := e[0], e[1], links.all[e[2]]
		from := fmt.Sprintf("127.0.0.1:%d", peerPorts[i][1])
		to := fmt.Sprintf("127.0.0.1:%d", views[j][i][1])
		if len(from) != len(to) {
			return fail(fmt.Errorf("zookeeper: election link ports of different lengths (%s, %s)", from, to))
		}
		l.rewrite.Store(&[2][]byte{[]byte(from), []byte(to)})
	}
	for i, z := range zs {
		var peers strings.Builder
		for j, p := range views[i] {
			fmt.Fprintf(&peers, "server.%d=127.0.0.1:%d:%d\n", j+1, p[0], p[1])
		}
		cfg := z.baseConfig() + "initLimit=20\nsyncLimit=10\n" + peers.String()
		if err := os.WriteFile(filepath.Join(z.dir, "zoo.cfg"), []byte(cfg), 0o644); err != nil {
			return fail(err)
		}
		if err := os.WriteFile(filepath.Join(z.dir, "data", "myid"), []byte(fmt.Sprintf("%d\n", i+1)), 0o644); err != nil {
			return fail(err)
		}
		z.args = z.javaArgs("org.apache.zookeeper.server.quorum.QuorumPeerMain")
	}
	for _, z := range zs {
		if err := z.launch(); err != nil {
			for _, o := range zs {
				o.Kill()
			}
			return fail(err)
		}
	}
	for _, z := range zs {
		if err := z.waitServing(zkStartupWait); err != nil {
			for _, o := range zs {
				o.Kill()
			}
			return fail(err)
		}
	}
	return zs, links, nil
}

func (z *ZooKeeper) baseConfig() string {
	data := filepath.Join(z.dir, "data")
	_ = os.MkdirAll(data, 0o755)
	return fmt.Sprintf(`tickTime=%d
dataDir=%s
clientPort=%d
clientPortAddress=127.0.0.1
admin.enableServer=false
4lw.commands.whitelist=srvr,ruok,mntr
maxClientCnxns=0
minSessionTimeout=%d
maxSessionTimeout=%d
forceSync=no
`, ZKTick.Milliseconds(), data, z.Port, 2*ZKTick.Milliseconds(), 120*ZKTick.Milliseconds())
}

func (z *ZooKeeper) javaArgs(main string) []string {
	return []string{
		// A small heap and the serial collector: tests need no more, and
		// several JVMs share two cores. The optimizing compiler stays on
		// (it costs little at start and the benchmark needs it).
		"-Xms32m", "-Xmx256m", "-XX:+UseSerialGC", "-Xshare:auto",
		"-Dzookeeper.admin.enableServer=false",
		"-Dzookeeper.log.dir=" + z.dir,
		"-cp", zkJar, main, filepath.Join(z.dir, "zoo.cfg"),
	}
}

func (z *ZooKeeper) launch() error {
	if _, err := os.Stat(zkJar); err != nil {
		return fmt.Errorf("zookeeper: %s not found (%v); install Debian's zookeeper package (scripts/install-test-deps.sh)", zkJar, err)
	}
	cmd := exec.Command("java", z.args...)
	cmd.Dir = z.dir
	c, err := startChild(cmd)
	if err != nil {
		return fmt.Errorf("zookeeper: start java: %w", err)
	}
	z.mu.Lock()
	z.cur = c
	z.mu.Unlock()
	return nil
}

// waitServing waits until the server answers srvr with its mode (standalone,
// leader or follower): it then serves sessions.
func (z *ZooKeeper) waitServing(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last string
	for time.Now().Before(deadline) {
		c := z.current()
		if c != nil && c.exited() {
			return fmt.Errorf("zookeeper on %s exited early: %s", z.Addr, tailLines(c.out.String(), 20))
		}
		out, err := FourLetter(z.Addr, "srvr", time.Second)
		if err == nil && strings.Contains(out, "Mode:") {
			return nil
		}
		last = out
		if err != nil {
			last = err.Error()
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("zookeeper on %s not serving after %v (last: %q)", z.Addr, timeout, strings.TrimSpace(last))
}

// FourLetter sends a four-letter word (srvr, ruok, mntr) and returns the
// reply.
func FourLetter(addr, word string, timeout time.Duration) (string, error) {
	c, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	if _, err := io.WriteString(c, word); err != nil {
		return "", err
	}
	b, err := io.ReadAll(c)
	if err != nil && len(b) == 0 {
		return "", err
	}
	return string(b), nil
}

// Mode returns the server's mode as srvr reports it (standalone, leader,
// follower), or an error when it does not serve.
func (z *ZooKeeper) Mode() (string, error) {
	out, err := FourLetter(z.Addr, "srvr", 2*time.Second)
	if err != nil {
		return "", err
	}
	for _, l := range strings.Split(out, "\n") {
		if m, ok := strings.CutPrefix(l, "Mode: "); ok {
			return strings.TrimSpace(m), nil
		}
	}
	return "", errors.New("zookeeper: not serving: " + strings.TrimSpace(out))
}

func (z *ZooKeeper) current() *child {
	z.mu.Lock()
	defer z.mu.Unlock()
	return z.cur
}

// Kill SIGKILLs the server (by PID and process group) and reaps it.
func (z *ZooKeeper) Kill() {
	if c := z.current(); c != nil {
		c.kill()
	}
}

// Restart starts the server again with the same configuration and data
// after Kill, and waits until it serves (as part of its ensemble, if any).
func (z *ZooKeeper) Restart() error {
	z.Kill()
	if err := z.launch(); err != nil {
		return err
	}
	return z.waitServing(zkStartupWait)
}

// Pause stops the server with SIGSTOP; Resume continues it.
func (z *ZooKeeper) Pause() { z.sig(syscall.SIGSTOP) }

// Resume continues a paused server with SIGCONT.
func (z *ZooKeeper) Resume() { z.sig(syscall.SIGCONT) }

func (z *ZooKeeper) sig(s syscall.Signal) {
	if c := z.current(); c != nil {
		_ = c.signal(s)
	}
}

// PID returns the server's process ID (0 before it started).
func (z *ZooKeeper) PID() int {
	if c := z.current(); c != nil {
		return c.pid()
	}
	return 0
}

// Output returns what the server printed (its log goes to stdout).
func (z *ZooKeeper) Output() string {
	if c := z.current(); c != nil {
		return c.out.String()
	}
	return ""
}

// Link is a byte-transparent TCP proxy on a free loopback port in front of
// one server, whose traffic can be cut (both directions dropped, the
// connections left open, as a partition that drops packets does) and
// healed. test/faultproxy speaks RESP on the way to the server, which
// ZooKeeper's protocol is not.
type Link struct {
	ln       net.Listener
	upstream string
	cut      atomic.Bool
	// Connections are numbered as accepted; those numbered up to
	// stranded drop every byte (Strand).
	accepted, stranded atomic.Int64
	// rewrite, when set, is a pair of equally long byte strings: the
	// first is replaced by the second in what clients send (see
	// launchEnsemble).
	rewrite atomic.Pointer[[2][]byte]
	// strandOn, when set, is what strands the next connection whose
	// client sends it (StrandOn).
	strandOn atomic.Pointer[[]byte]

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// StartLink starts a Link to upstream and registers its Close.
func StartLink(t testing.TB, upstream string) *Link {
	t.Helper()
	l, err := newLink(upstream)
	if err != nil {
		t.Fatalf("harness: %v", err)
	}
	t.Cleanup(l.Close)
	return l
}

// newLink starts a Link to upstream; the caller must Close it.
func newLink(upstream string) (*Link, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("link: %w", err)
	}
	l := &Link{ln: ln, upstream: upstream, conns: map[net.Conn]struct{}{}}
	l.wg.Add(1)
	go l.accept()
	return l, nil
}

// Addr is the address clients dial instead of the server's.
func (l *Link) Addr() string { return l.ln.Addr().String() }

// Cut drops every byte from now on, both ways, on open and new connections.
func (l *Link) Cut() { l.cut.Store(true) }

// Strand drops every byte, both ways and for good, of the connections open
// now, as a NAT or firewall that forgot them does; they stay open, and new
// connections pass.
func (l *Link) Strand() { l.stranded.Store(l.accepted.Load()) }

// StrandOn strands the first connection whose client sends pattern (in
// one read), from those bytes on, for good: a link that stops delivering
// in the middle of a connection's life, at a point of the protocol the
// test chooses. Only that one connection: those after it pass.
func (l *Link) StrandOn(pattern []byte) { l.strandOn.Store(&pattern) }

// Heal closes the connections that lost bytes (their streams have a hole)
// and lets bytes through again.
func (l *Link) Heal() {
	l.mu.Lock()
	for c := range l.conns {
		_ = c.Close()
	}
	l.mu.Unlock()
	l.cut.Store(false)
}

// Close stops the link and waits for its goroutines.
func (l *Link) Close() {
	_ = l.ln.Close()
	l.mu.Lock()
	l.closed = true
	for c := range l.conns {
		_ = c.Close()
	}
	l.mu.Unlock()
	l.wg.Wait()
}

// track records a connection's two ends, unless the link is closed.
func (l *Link) track(c, s net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false
	}
	l.conns[c] = struct{}{}
	l.conns[s] = struct{}{}
	return true
}

func (l *Link) accept() {
	defer l.wg.Done()
	for {
		c, err := l.ln.Accept()
		if err != nil {
			return
		}
		l.wg.Add(1)
		go l.connect(c)
	}
}

// linkDialWait is how long a link tries to reach its upstream for a
// connection it accepted. A server that does not listen yet (a ZooKeeper
// leader binds its quorum port only once elected) refuses a direct
// connect, which the client retries; through a link, which accepted it
// already, the client would see its connection closed instead, and a
// ZooKeeper follower then gives up following and starts another election.
const linkDialWait = 3 * time.Second

// connect pipes c to a new connection to the upstream, retried for up to
// linkDialWait; c is closed if none is made.
func (l *Link) connect(c net.Conn) {
	defer l.wg.Done()
	var s net.Conn
	for end := time.Now().Add(linkDialWait); ; time.Sleep(20 * time.Millisecond) {
		var err error
		if s, err = net.DialTimeout("tcp", l.upstream, 2*time.Second); err == nil {
			break
		}
		if time.Now().After(end) {
			_ = c.Close()
			return
		}
	}
	if !l.track(c, s) {
		_ = c.Close()
		_ = s.Close()
		return
	}
	id := l.accepted.Add(1)
	lost := new(atomic.Bool) // stranded by StrandOn
	l.wg.Add(2)
	go l.pipe(c, s, id, lost, true, l.rewrite.Load())
	go l.pipe(s, c, id, lost, false, nil)
}

// pipe copies src to dst until either ends, dropping bytes while cut, and
// for good once its connection (number id) is stranded, by Strand or, lost
// set, by StrandOn (which toServer, the client's side, looks for).
func (l *Link) pipe(src, dst net.Conn, id int64, lost *atomic.Bool, toServer bool, rewrite *[2][]byte) {
	defer l.wg.Done()
	defer func() {
		_ = src.Close()
		_ = dst.Close()
		l.mu.Lock()
		delete(l.conns, src)
		delete(l.conns, dst)
		l.mu.Unlock()
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if p := l.strandOn.Load(); toServer && n > 0 && p != nil && bytes.Contains(buf[:n], *p) && l.strandOn.CompareAndSwap(p, nil) {
			lost.Store(true)
		}
		if n > 0 && !l.cut.Load() && id > l.stranded.Load() && !lost.Load() {
			if rewrite != nil {
				// Same length: a length field before it stays right.
				copy(buf[:n], bytes.ReplaceAll(buf[:n], rewrite[0], rewrite[1]))
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
