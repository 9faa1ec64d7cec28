package conf

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"net"
	"net/netip"
	"path"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"gopkg.in/yaml.v3"
)

// Backend names accepted in Config.Backend.
const (
	BackendRedlock   = "redlock"
	BackendZookeeper = "zookeeper"
	BackendPostgres  = "postgres"
)

// identRE is what postgres.schema and postgres.table_prefix may be:
// lower-case SQL identifiers, which need no quoting in psql either.
var identRE = regexp.MustCompile(`^[a-z_][a-z0-9_]*$`)

// redacted replaces secrets in String.
const redacted = "<redacted>"

// ProcsAuto lets lockproxy size Go's scheduler to its load (package
// procs): one P while it uses less than most of a core, all of them past
// that.
const ProcsAuto = "auto"

// maxProcs bounds a fixed procs setting.
const maxProcs = 1024

// ProcsFixed returns the number of Ps Procs fixes, or 0 for ProcsAuto.
func (c Config) ProcsFixed() (int, error) {
	if c.Procs == ProcsAuto {
		return 0, nil
	}
	n, err := strconv.Atoi(c.Procs)
	if err != nil || n < 1 || n > maxProcs {
		return 0, fmt.Errorf("must be %s or a number of threads from 1 to %d, got %q", ProcsAuto, maxProcs, c.Procs)
	}
	return n, nil
}

// Config is the whole lockproxy configuration.
type Config struct {
	Listen string `yaml:"listen"` // RESP listener, host:port
	Admin  string `yaml:"admin"`  // HTTP /metrics /healthz /readyz; "" disables
	// AdminPprof serves /debug/pprof/ on the admin listener to every peer.
	// Off, it is served to loopback peers only, wherever admin binds:
	// profiles show code paths and heap contents, and a CPU profile or
	// trace costs the process while it runs.
	AdminPprof   bool      `yaml:"admin_pprof"`
	Backend      string    `yaml:"backend"`       // BackendRedlock, BackendZookeeper or BackendPostgres
	Dev          bool      `yaml:"dev"`           // embedded in-process nodes, for trying out only
	Procs        string    `yaml:"procs"`         // ProcsAuto or a number of Ps (GOMAXPROCS)
	Upstream     Upstream  `yaml:"upstream"`      // the Redis other commands are relayed to; "upstream: host:port" sets only its address
	LockPatterns []string  `yaml:"lock_patterns"` // key globs served as locks in transparent mode
	Log          Log       `yaml:"log"`
	Redlock      Redlock   `yaml:"redlock"`
	Locks        Locks     `yaml:"locks"`
	Zookeeper    Zookeeper `yaml:"zookeeper"`
	Postgres     Postgres  `yaml:"postgres"`
	Limits       Limits    `yaml:"limits"`
	Auth         Auth      `yaml:"auth"`
	TLS          ServerTLS `yaml:"tls"` // TLS on the listener

	// unknownEnv warns of LOCKPROXY_* variables that name no key, as
	// FromArgs found them (Warnings).
	unknownEnv []string
	// file is the config file FromArgs read, absolute (File).
	file string
}

// File returns the absolute path of the config file the config was read
// from, or "" when none was given. INFO shows it as config_file, as Redis
// does, so that an operator can tell which file a running instance read.
func (c Config) File() string { return c.file }

// Auth is what lockproxy's own clients must give before other commands:
// the default user's password (AUTH <password>, or HELLO … AUTH default
// <password>), like Redis's requirepass, and named users (AUTH <user>
// <password>), like Redis ACL users with a password and every permission.
// Nothing set: no authentication.
type Auth struct {
	Password string `yaml:"password" secret:"true"`
	// Users are "name:password" entries (the password may contain ':').
	Users []string `yaml:"users,omitempty" secret:"true"`
	// Permissions limit users, in Redis's ACL words: "app ~app:* +@lock
	// +get +set" lets user app run the lock commands, GET and SET, on keys
	// that match app:* only. A user without an entry may do everything.
	Permissions []string `yaml:"permissions,omitempty"`
}

// Permission is one parsed auth.permissions entry.
type Permission struct {
	User string
	// Keys are the globs every key of a command must match, when
	// LimitKeys; otherwise any key may be used.
	Keys      []string
	LimitKeys bool
	// Channels are the globs every pub/sub channel must match (a
	// PSUBSCRIBE pattern must equal one), when LimitChannels.
	Channels      []string
	LimitChannels bool
	// Commands are the command rules in their order, each "+" (allow) or
	// "-" (deny) and then a lower-case command ("get"), subcommand
	// ("config|get") or category ("@write"; "@lock" is lockproxy's lock
	// commands, "@all" every command). The last rule that matches a
	// command decides; none: refused.
	Commands []string
}

// Categories are the command categories a rule may name: Redis's ACL
// categories, and lockproxy's @lock.
var Categories = []string{
	"@all", "@lock", "@keyspace", "@read", "@write", "@set", "@sortedset", "@list", "@hash", "@string",
	"@bitmap", "@hyperloglog", "@geo", "@stream", "@pubsub", "@admin", "@fast", "@slow", "@blocking",
	"@dangerous", "@connection", "@transaction", "@scripting",
}

// containerCommands are Redis's commands with subcommands (CONFIG GET).
var containerCommands = []string{
	"acl", "client", "cluster", "command", "config", "function", "latency", "memory", "module",
	"object", "pubsub", "script", "slowlog", "xgroup", "xinfo",
}

// ParsePermission parses an auth.permissions entry: a user name, then
// rules in Redis's ACL words — "~glob", "allkeys", "resetkeys", "&glob",
// "allchannels", "resetchannels", "+command", "-command",
// "+command|subcommand", "+@category", "-@category", "allcommands",
// "nocommands". Passwords and on/off come from auth.users.
func ParsePermission(s string) (Permission, error) {
	f := strings.Fields(s)
	if len(f) < 2 {
		return Permission{}, errors.New(`want "user ~glob… +command…", with at least one rule`)
	}
	p := Permission{User: f[0]}
	allows := false
	for _, r := range f[1:] {
		lr := strings.ToLower(r)
		switch {
		case lr == "allkeys":
			p.Keys, p.LimitKeys = []string{"*"}, true
		case lr == "resetkeys":
			p.Keys, p.LimitKeys = nil, true
		case strings.HasPrefix(r, "~") && len(r) > 1:
			if _, err := path.Match(r[1:], ""); err != nil {
				return Permission{}, fmt.Errorf("invalid key glob %q: %v", r[1:], err)
			}
			p.Keys, p.LimitKeys = append(p.Keys, r[1:]), true
		case lr == "allchannels":
			p.Channels, p.LimitChannels = []string{"*"}, true
		case lr == "resetchannels":
			p.Channels, p.LimitChannels = nil, true
		case strings.HasPrefix(r, "&") && len(r) > 1:
			if _, err := path.Match(r[1:], ""); err != nil {
				return Permission{}, fmt.Errorf("invalid channel glob %q: %v", r[1:], err)
			}
			p.Channels, p.LimitChannels = append(p.Channels, r[1:]), true
		case lr == "allcommands":
			p.Commands, allows = append(p.Commands, "+@all"), true
		case lr == "nocommands":
			p.Commands = append(p.Commands, "-@all")
		case (r[0] == '+' || r[0] == '-') && len(r) > 1:
			c := lr[1:]
			if strings.HasPrefix(c, "@") {
				if !slices.Contains(Categories, c) {
					return Permission{}, fmt.Errorf("unknown category %q: lockproxy knows @all, @lock and Redis's ACL categories (@read, @write, @keyspace, @dangerous, …)", r[1:])
				}
			} else if name, sub, ok := strings.Cut(c, "|"); ok {
				switch {
				case name == "" || sub == "" || strings.Contains(sub, "|"):
					return Permission{}, fmt.Errorf("rule %q: want +command|subcommand", r)
				case r[0] == '-' && !slices.Contains(containerCommands, name):
					// As Redis 7: "-get|secret" would not keep MGET
					// or GETDEL from the key; key patterns do.
					return Permission{}, fmt.Errorf("rule %q: %s has no subcommands, and a first argument cannot be taken away (use -%s, or ~ key patterns)", r, name, name)
				}
			}
			p.Commands = append(p.Commands, lr)
			allows = allows || r[0] == '+'
		case strings.HasPrefix(r, "%"):
			return Permission{}, fmt.Errorf("rule %q: read- and write-only key patterns are not supported; ~glob allows both", r)
		case strings.HasPrefix(r, "("):
			return Permission{}, fmt.Errorf("rule %q: selectors are not supported", r)
		case r[0] == '>' || r[0] == '<' || r[0] == '#' || r[0] == '!' || slices.Contains([]string{"on", "off", "nopass", "resetpass", "reset"}, lr):
			// Not quoted: the rule may be a password.
			return Permission{}, errors.New("password and user-state rules (>…, #…, nopass, on, off, reset…) are not taken here: passwords come from auth.users and auth.password")
		default:
			return Permission{}, fmt.Errorf("rule %q: want ~glob, &glob, +command, -command or +@category", r)
		}
	}
	if !allows {
		return Permission{}, errors.New("no +command rule: the user could run nothing (+@all for every command)")
	}
	return p, nil
}

// UserPasswords returns the named users' passwords by name; Validate has
// checked the entries.
func (a Auth) UserPasswords() map[string]string {
	if len(a.Users) == 0 {
		return nil
	}
	out := make(map[string]string, len(a.Users))
	for _, u := range a.Users {
		name, pass, _ := strings.Cut(u, ":")
		out[name] = pass
	}
	return out
}

// Upstream configures the relay to the Redis that serves every command
// lockproxy does not serve itself.
type Upstream struct {
	Address     string        `yaml:"address"` // host:port; "" = no relay
	Username    string        `yaml:"username"`
	Password    string        `yaml:"password" secret:"true"`
	PoolSize    int           `yaml:"pool_size"` // shared connections per protocol
	DialTimeout time.Duration `yaml:"dial_timeout"`
	ReadTimeout time.Duration `yaml:"read_timeout"` // 0: none; blocking commands never time out
	// DenyCommands are refused instead of relayed: "flushall", or
	// "client|kill" for a subcommand. Setting it replaces the default list.
	DenyCommands []string `yaml:"deny_commands"`
	// EventLoop serves client connections on an epoll event loop (Linux)
	// while they only relay plain commands; a connection moves to a
	// goroutine of its own at its first lock command, transaction or
	// blocking command. Off: every connection has a goroutine.
	EventLoop bool `yaml:"event_loop"`
	// TLS to the upstream.
	TLS TLS `yaml:"tls"`
}

// DefaultDenyCommands reconfigure, wipe or stop the shared upstream, or
// watch every client's traffic. SWAPDB would move every lock of an
// upstream that is also a lock node out of its database at once.
var DefaultDenyCommands = []string{
	"config", "debug", "flushall", "flushdb", "shutdown", "monitor", "acl", "module",
	"replicaof", "slaveof", "sync", "psync", "failover", "script|flush", "function|flush", "client|kill",
	"swapdb",
}

// Log configures the zap logger.
type Log struct {
	Level  string `yaml:"level"`  // debug|info|warn|error
	Format string `yaml:"format"` // json|console
}

// Redlock configures the RedLock backend and its nodes.
type Redlock struct {
	Nodes             []string      `yaml:"nodes"` // host:port each
	Username          string        `yaml:"username"`
	Password          string        `yaml:"password" secret:"true"`
	PasswordFile      string        `yaml:"password_file"` // read into Password at load time
	TLS               TLS           `yaml:"tls"`           // TLS to every node
	KeyPrefix         string        `yaml:"key_prefix"`
	DriftFactor       float64       `yaml:"drift_factor"`
	DriftMin          time.Duration `yaml:"drift_min"`
	NodeTimeoutFactor float64       `yaml:"node_timeout_factor"` // of the TTL
	NodeTimeoutMin    time.Duration `yaml:"node_timeout_min"`
	NodeTimeoutMax    time.Duration `yaml:"node_timeout_max"`
	PoolSize          int           `yaml:"pool_size"`        // go-redis connections per node
	PipelineWorkers   int           `yaml:"pipeline_workers"` // batching writers per node
	MaxBatch          int           `yaml:"max_batch"`        // commands per pipelined write
	DialTimeout       time.Duration `yaml:"dial_timeout"`
	// Quarantine keeps a node that restarted (a new run_id) out of every
	// quorum for locks.max_ttl plus drift, then re-seeds its fence counters
	// from the other nodes before it votes again.
	Quarantine bool `yaml:"quarantine"`
	// RestartCheckInterval is how often each node's run_id is read; the
	// proxy also reads it on every new connection, and never waits longer
	// than locks.max_ttl/4 between reads.
	RestartCheckInterval time.Duration `yaml:"restart_check_interval"`
	// MaxClockRateError is the clock rate error (|rate − 1| of a node's
	// clock against the proxy's, measured with TIME at each restart check)
	// beyond which a node stops voting until its estimate is back within.
	// A measured error above drift_factor but within this bound lengthens
	// the drift allowance instead.
	MaxClockRateError float64 `yaml:"max_clock_rate_error"`
}

// Locks bounds the leases and waits clients may ask for.
type Locks struct {
	DefaultTTL time.Duration `yaml:"default_ttl"` // lease when LOCK gives no PX/EX
	MaxTTL     time.Duration `yaml:"max_ttl"`     // a LOCK asking more is refused
	MinTTL     time.Duration `yaml:"min_ttl"`
	MaxWait    time.Duration `yaml:"max_wait"`  // cap on WAIT
	RetryMin   time.Duration `yaml:"retry_min"` // jittered retry delay bounds
	RetryMax   time.Duration `yaml:"retry_max"`
	// KeepaliveIdle: a KEEPALIVE lock is renewed only while its connection
	// sent a command (PING will do) within this window; after that the
	// lease runs out and the lock is lost.
	KeepaliveIdle time.Duration `yaml:"keepalive_idle"`
	// MaxKeepalive bounds the KEEPALIVE locks of the whole instance, over
	// all connections: each is a watchdog (a goroutine, and a renewal
	// every TTL/3 on the lock store), and the per-connection bound alone
	// lets many connections take any number of them.
	MaxKeepalive int `yaml:"max_keepalive"`
	// LockDelay lists "pattern=duration" items (Chubby's lock-delay): after
	// a KEEPALIVE holder of a key matching pattern lost its lock without
	// releasing it (its connection dropped, it went idle, MAXHOLD ran
	// out), nobody else gets the key for duration. Empty: no delay.
	LockDelay []string `yaml:"lock_delay"`
}

// LockDelay is one parsed locks.lock_delay item.
type LockDelay struct {
	Pattern string
	Delay   time.Duration
}

// ParseLockDelay parses a locks.lock_delay item, "pattern=duration". The
// pattern is a path.Match glob; the last '=' separates the duration, so a
// pattern may itself contain '='.
func ParseLockDelay(item string) (LockDelay, error) {
	i := strings.LastIndexByte(item, '=')
	if i <= 0 {
		return LockDelay{}, fmt.Errorf("want pattern=duration such as 'order:*=5s', got %q", item)
	}
	pat, dur := item[:i], strings.TrimSpace(item[i+1:])
	if _, err := path.Match(pat, ""); err != nil {
		return LockDelay{}, fmt.Errorf("bad pattern %q: %v", pat, err)
	}
	d, err := time.ParseDuration(dur)
	if err != nil || d <= 0 {
		return LockDelay{}, fmt.Errorf("want a positive duration after '=' in %q", item)
	}
	return LockDelay{Pattern: pat, Delay: d}, nil
}

// LockDelays parses every locks.lock_delay item (Validate has checked them).
func (l Locks) LockDelays() []LockDelay {
	var out []LockDelay
	for _, item := range l.LockDelay {
		if d, err := ParseLockDelay(item); err == nil {
			out = append(out, d)
		}
	}
	return out
}

// Zookeeper configures the ZooKeeper backend.
type Zookeeper struct {
	Servers []string `yaml:"servers"` // host:port each
	Root    string   `yaml:"root"`
	// SessionTimeout is asked of the servers for lockproxy's session; it
	// also caps the validity of every lock (a lock lives in the session):
	// at 5/12 of it, or at 2/3 of it less half of TickTime when TickTime
	// is set. Servers whose maxSessionTimeout is below it negotiate less,
	// which then counts instead (a warning is logged).
	SessionTimeout time.Duration `yaml:"session_timeout"`
	// TickTime is the servers' tickTime, when known (0: taken as half the
	// session timeout, the most it is with ZooKeeper's default
	// minSessionTimeout).
	TickTime time.Duration `yaml:"tick_time"`
	// Digest, "user:password", authenticates the session with ZooKeeper's
	// digest scheme, and every znode lockproxy creates (the root included)
	// then gets an ACL giving that user alone all rights.
	Digest     string `yaml:"digest" secret:"true"`
	DigestFile string `yaml:"digest_file"` // read into Digest at load time
}

// Postgres configures the PostgreSQL backend.
type Postgres struct {
	// DSN is a libpq connection string or URL; it may hold the password,
	// so the whole of it is redacted in logs.
	DSN     string `yaml:"dsn" secret:"true"`
	DSNFile string `yaml:"dsn_file"` // read into DSN at load time
	// Schema holds the lock tables; it must exist.
	Schema string `yaml:"schema"`
	// TablePrefix starts the tables' names: <prefix>holds,
	// <prefix>waiting_writers and the sequence <prefix>fence.
	TablePrefix string `yaml:"table_prefix"`
	// PoolSize caps the connections lockproxy opens (one more LISTENs).
	PoolSize int `yaml:"pool_size"`
	// SweepInterval is how often expired rows are deleted.
	SweepInterval time.Duration `yaml:"sweep_interval"`
	// OpTimeout bounds each operation on the database (a lock try, an
	// unlock, a renewal), so a database that hangs gets clients an error.
	OpTimeout time.Duration `yaml:"op_timeout"`
}

// Limits bounds what clients can make the proxy hold.
type Limits struct {
	MaxClients      int           `yaml:"max_clients"`
	MaxKeyBytes     int           `yaml:"max_key_bytes"`
	MaxTokenBytes   int           `yaml:"max_token_bytes"`
	ShutdownTimeout time.Duration `yaml:"shutdown_timeout"`
	// AuthTimeout closes a connection still not authenticated this long
	// after it was accepted, when auth.password or auth.users is set; 0
	// never does.
	AuthTimeout time.Duration `yaml:"auth_timeout"`
	// MaxOutputBytes bounds the replies a connection holds for a client
	// that reads them slower than it sends commands (Redis's
	// client-output-buffer-limit); past it the client is closed. 0: no
	// limit.
	MaxOutputBytes int `yaml:"max_output_bytes"`
	// MaxOutputBytesPubSub bounds them instead, where lower, while the
	// client is subscribed: messages come at the publishers' pace, not
	// the client's (Redis's client-output-buffer-limit pubsub, 32 MB).
	// 0: MaxOutputBytes does.
	MaxOutputBytesPubSub int `yaml:"max_output_bytes_pubsub"`
}

// Default returns the configuration used where file, environment and flags
// say nothing. It validates once Dev is set or Redlock.Nodes is given.
func Default() Config {
	return Config{
		// Loopback until the operator chooses to expose locks; 7380 sits
		// beside Redis's 6379 without taking a port Redis uses.
		Listen: "127.0.0.1:7380",
		// Loopback: metrics and probes are for the local scraper; 9380
		// pairs with 7380 in the 9xxx exporter range.
		Admin: "127.0.0.1:9380",
		// AdminPprof off: an admin port opened to a Prometheus on another
		// host does not open profiling to it as well.
		AdminPprof: false,
		// RedLock needs nothing but Redis nodes.
		Backend: BackendRedlock,
		Procs:   ProcsAuto,
		Upstream: Upstream{
			// Few connections make big batches: each carries many
			// clients' pipelined requests (test/bench passthrough table).
			PoolSize: 4,
			// Loopback and LAN dials take milliseconds.
			DialTimeout: time.Second,
			// Longer than any ordinary command; a Redis silent for this
			// long is treated as down and its connection dropped.
			ReadTimeout:  10 * time.Second,
			DenyCommands: append([]string(nil), DefaultDenyCommands...),
			// A third less CPU per relayed request (test/bench passthrough).
			EventLoop: true,
		},
		Log: Log{
			Level:  "info", // zap's production level: no per-command noise
			Format: "json", // zap's production encoder, for log collectors
		},
		Redlock: Redlock{
			// Keeps lock keys apart from application keys on shared nodes.
			KeyPrefix: "lockproxy:",
			// antirez's redlock-rb value, also redsync's and node-redlock's.
			DriftFactor: 0.01,
			// Redis expires keys with 1 ms precision, plus 1 ms.
			DriftMin: 2 * time.Millisecond,
			// A slow node may cost at most 5% of the lease (redsync's
			// timeout factor, after the RedLock spec's advice).
			NodeTimeoutFactor: 0.05,
			// Below 10 ms a busy but healthy LAN node looks down.
			NodeTimeoutMin: 10 * time.Millisecond,
			// With long TTLs one dead node must not stall every acquire.
			NodeTimeoutMax: 250 * time.Millisecond,
			// Pipelining multiplexes many commands per connection.
			PoolSize: 8,
			// One writer per node makes the biggest batches: while one pipelined
			// write is in flight the next batch gathers (test/bench: 1 beat 2 and 4).
			PipelineWorkers: 1,
			// Amortises syscalls while bounding one batch's latency.
			MaxBatch: 256,
			// LAN dials take milliseconds; a second tells a dead node
			// apart without stalling start-up.
			DialTimeout: time.Second,
			// A node restarted without persistence has forgotten the locks
			// it granted: letting it vote at once can grant one lock twice
			// (RedLock's "delayed restarts").
			Quarantine: true,
			// Reconnects catch most restarts at once; a read per second
			// per node catches the rest while costing the node nothing.
			RestartCheckInterval: time.Second,
			// Five times the drift factor: healthy clocks are within
			// 0.01 % (NTP slews at most 0.05 %), so a node off by 5 % is
			// broken or faked, and the extra drift it would need (4 % of
			// every lease) is the most worth paying to keep it voting.
			MaxClockRateError: 0.05,
		},
		Locks: Locks{
			// Redisson's watchdog default (lockWatchdogTimeout).
			DefaultTTL: 30 * time.Second,
			// A leaked lock blocks for at most 10 minutes, and nodes need
			// to keep their data only that long after a restart.
			MaxTTL: 10 * time.Minute,
			// Shorter leases are eaten by drift and round trips.
			MinTTL: 10 * time.Millisecond,
			// Waiting longer than the longest lease makes no sense.
			MaxWait: 10 * time.Minute,
			// Jitter spreads contenders; the floor avoids hot spinning.
			RetryMin: 20 * time.Millisecond,
			// antirez's reference sleeps rand(200) ms between tries.
			RetryMax: 200 * time.Millisecond,
			// Twice the default lease: a client that PINGs as often as
			// connection pools check their connections (30 s) keeps its
			// locks, while a hung one loses them within about 90 s.
			KeepaliveIdle: 60 * time.Second,
			// Ten connections' worth of the per-connection bound: 100,000
			// locks of the default 30 s lease renew 10,000 times a second.
			MaxKeepalive: 100000,
		},
		Zookeeper: Zookeeper{
			// One subtree per application, easy to ACL and inspect.
			Root: "/lockproxy",
			// A lost holder frees its locks within seconds; above ZK's
			// default floor of 2×tickTime (4 s).
			SessionTimeout: 10 * time.Second,
		},
		Postgres: Postgres{
			Schema: "public",
			// Names that say whose tables they are.
			TablePrefix: "lockproxy_",
			// Each statement holds a connection for a millisecond or so;
			// 10 serve thousands of grants a second.
			PoolSize: 10,
			// Expired rows are ignored by every check: the sweep only keeps
			// the table small.
			SweepInterval: 10 * time.Second,
			// Far above a healthy statement's milliseconds, well below a
			// client's patience.
			OpTimeout: 5 * time.Second,
		},
		Limits: Limits{
			// Redis's own maxclients default.
			MaxClients: 10000,
			// Bounds memory per key; real lock names are far shorter.
			MaxKeyBytes: 64 << 10,
			// Generated tokens are 128 bits; room for client UUIDs and more.
			MaxTokenBytes: 256,
			// Leaves room in Kubernetes' 30 s grace period for releases.
			ShutdownTimeout: 10 * time.Second,
			// A client that knows the password has sent it by then; one
			// that does not only holds a connection slot.
			AuthTimeout: 10 * time.Second,
			// Redis does not limit normal clients; a bound still keeps
			// one client that never reads from taking the host's memory.
			// 1 GB holds the largest reply there is (a 512 MB value) with
			// room, and a go-redis pipeline written whole before its
			// replies are read (tens of thousands of values of KBs).
			MaxOutputBytes: 1 << 30,
			// Redis's hard limit for pub/sub clients.
			MaxOutputBytesPubSub: 32 << 20,
		},
	}
}

// maxPostgresOpTimeout is the longest postgres.op_timeout: each grant's
// transaction sets idle_in_transaction_session_timeout to it (backends/
// postgres), an int of milliseconds in PostgreSQL, which refuses more, and
// then every LOCK would fail.
const maxPostgresOpTimeout = math.MaxInt32 * time.Millisecond

// maxZookeeperSessionTimeout is the longest zookeeper.session_timeout: the
// ZooKeeper client (go-zookeeper) sends it in the connect request as an
// int32 of milliseconds, so a longer one would wrap around.
const maxZookeeperSessionTimeout = math.MaxInt32 * time.Millisecond

// minZookeeperValidity is the least validity the ZooKeeper backend
// grants (backends.MinValidity, which conf may not import).
const minZookeeperValidity = time.Millisecond

// Bounds of Redlock.RestartCheckInterval. Faster than 250 ms, INFO reads
// add up on busy nodes for no gain (reconnects are caught anyway); slower
// than 5 s, a restart behind a connection that never broke (a proxy or a
// load balancer in between) goes unseen for too long.
const (
	MinRestartCheckInterval = 250 * time.Millisecond
	MaxRestartCheckInterval = 5 * time.Second
)

// RestartCheckEvery is the period at which each node's run_id is read:
// redlock.restart_check_interval, but at most a quarter of locks.max_ttl so
// a restart is seen well before the locks it forgot could have expired.
func (c Config) RestartCheckEvery() time.Duration {
	d := c.Redlock.RestartCheckInterval
	if q := c.Locks.MaxTTL / 4; q > 0 && q < d {
		d = q
	}
	// A floor against busy-polling with tiny test TTLs.
	if d < 10*time.Millisecond {
		d = 10 * time.Millisecond
	}
	return d
}

// EmbeddedNodes reports whether the locks come from --dev's three embedded
// in-process nodes: dev on the RedLock backend with no redlock.nodes. Given
// nodes, or another backend, dev starts nothing and the locks come from
// there. Every place that speaks of the embedded nodes (the start banner,
// the TLS refusal, the node-count warning, INFO's lockproxy_dev_mode)
// asks this, so that none claims them while real nodes serve the locks.
func (c Config) EmbeddedNodes() bool {
	return c.Dev && c.Backend == BackendRedlock && len(c.Redlock.Nodes) == 0
}

// ValidationError lists every problem found in a configuration, one per
// line, each starting with the key path (or environment variable) at fault.
type ValidationError struct {
	Problems []string
}

func (e *ValidationError) Error() string {
	if len(e.Problems) == 0 {
		return "conf: invalid configuration"
	}
	return strings.Join(e.Problems, "\n")
}

// Validate returns nil or a *ValidationError listing every problem, each
// prefixed with its key path, e.g.
// "redlock.drift_factor: must be in [0, 0.5), got 0.7".
func (c Config) Validate() error {
	var v validator
	v.addr("listen", c.Listen, false)
	if c.Admin != "" {
		v.addr("admin", c.Admin, false)
		if sameBind(c.Listen, c.Admin) {
			v.add("admin", "%s and listen %s cannot both bind: one port on one host (or on every interface); give admin another port", hideCredentials(c.Admin), hideCredentials(c.Listen))
		}
	}
	switch c.Backend {
	case BackendRedlock, BackendZookeeper, BackendPostgres:
	default:
		v.add("backend", "must be %s, %s or %s, got %q", BackendRedlock, BackendZookeeper, BackendPostgres, c.Backend)
	}
	if _, err := c.ProcsFixed(); err != nil {
		v.add("procs", "%v", err)
	}
	if u := c.Upstream; u.Address != "" {
		v.addr("upstream.address", u.Address, true)
		if dialsListener(u.Address, c.Listen) {
			v.add("upstream.address", "%s is lockproxy's own listener (listen %s): relayed commands would come back to lockproxy; give the Redis that serves them", hideCredentials(u.Address), hideCredentials(c.Listen))
		}
		v.between("upstream.pool_size", u.PoolSize, 1, 256)
		v.positive("upstream.dial_timeout", u.DialTimeout)
		if u.ReadTimeout < 0 {
			v.add("upstream.read_timeout", "must not be negative, got %v", u.ReadTimeout)
		}
		for i, d := range u.DenyCommands {
			if d == "" || strings.ContainsAny(d, " \t\r\n") {
				v.add(fmt.Sprintf("upstream.deny_commands[%d]", i), "want a command name such as flushall or client|kill, got %q", d)
			}
		}
		u.TLS.validate(&v, "upstream.tls")
	}
	seenUsers := map[string]bool{}
	for i, u := range c.Auth.Users {
		// The entry holds a password: problems name it by index only.
		key := fmt.Sprintf("auth.users[%d]", i)
		name, pass, ok := strings.Cut(u, ":")
		switch {
		case !ok || name == "" || pass == "":
			v.add(key, `want "name:password" with both parts non-empty`)
		case strings.ContainsAny(name, " \t\r\n"):
			v.add(key, "the user name must not contain spaces")
		case name == "default":
			v.add(key, "the default user's password is auth.password")
		case seenUsers[name]:
			v.add(key, "user %q is listed twice", name)
		}
		seenUsers[name] = true
	}
	seenPerm := map[string]bool{}
	for i, e := range c.Auth.Permissions {
		key := fmt.Sprintf("auth.permissions[%d]", i)
		p, err := ParsePermission(e)
		switch {
		case err != nil:
			v.add(key, "%v", err)
		case p.User == "default" && c.Auth.Password == "", p.User != "default" && !seenUsers[p.User]:
			v.add(key, "user %q is not in auth.users (or auth.password, for default)", p.User)
		case seenPerm[p.User]:
			v.add(key, "user %q has permissions twice", p.User)
		}
		seenPerm[p.User] = true
	}
	for i, p := range c.LockPatterns {
		key := fmt.Sprintf("lock_patterns[%d]", i)
		if p == "" {
			v.add(key, "must not be empty")
		} else if _, err := path.Match(p, ""); err != nil {
			v.add(key, "invalid glob %q: %v", p, err)
		}
	}
	c.TLS.validate(&v)
	v.oneOf("log.level", c.Log.Level, "debug", "info", "warn", "error")
	v.oneOf("log.format", c.Log.Format, "json", "console")

	r := c.Redlock
	if c.Backend == BackendRedlock && len(r.Nodes) == 0 && !c.EmbeddedNodes() {
		v.add("redlock.nodes", "at least one node is required (or use --dev)")
	}
	v.addrs("redlock.nodes", r.Nodes)
	for i, n := range r.Nodes {
		if dialsListener(n, c.Listen) {
			// As for upstream.address: the lock commands would come
			// back to lockproxy, and that node never answer one.
			v.add(fmt.Sprintf("redlock.nodes[%d]", i), "%s is lockproxy's own listener (listen %s): give a redis-server", hideCredentials(n), hideCredentials(c.Listen))
		}
	}
	r.TLS.validate(&v, "redlock.tls")
	// Only the embedded nodes speak no TLS: --dev with real nodes given
	// talks to them as configured.
	if c.EmbeddedNodes() && r.TLS.Enabled {
		v.add("redlock.tls.enabled", "the --dev nodes speak no TLS")
	}
	if r.KeyPrefix == "" {
		v.add("redlock.key_prefix", "must not be empty")
	}
	driftOK := r.DriftFactor >= 0 && r.DriftFactor < 0.5 // false for NaN too
	if !driftOK {
		v.add("redlock.drift_factor", "must be in [0, 0.5), got %g", r.DriftFactor)
	}
	if r.DriftMin < 0 {
		v.add("redlock.drift_min", "must not be negative, got %v", r.DriftMin)
	}
	if !(r.NodeTimeoutFactor > 0 && r.NodeTimeoutFactor < 1) {
		v.add("redlock.node_timeout_factor", "must be in (0, 1), got %g", r.NodeTimeoutFactor)
	}
	v.positive("redlock.node_timeout_min", r.NodeTimeoutMin)
	if v.positive("redlock.node_timeout_max", r.NodeTimeoutMax) && r.NodeTimeoutMax < r.NodeTimeoutMin {
		v.add("redlock.node_timeout_max", "must be >= redlock.node_timeout_min (%v), got %v", r.NodeTimeoutMin, r.NodeTimeoutMax)
	}
	v.between("redlock.pool_size", r.PoolSize, 1, -1)
	v.between("redlock.pipeline_workers", r.PipelineWorkers, 1, 64)
	v.between("redlock.max_batch", r.MaxBatch, 1, 10000)
	v.positive("redlock.dial_timeout", r.DialTimeout)
	if r.RestartCheckInterval < MinRestartCheckInterval || r.RestartCheckInterval > MaxRestartCheckInterval {
		v.add("redlock.restart_check_interval", "must be in [%v, %v], got %v", MinRestartCheckInterval, MaxRestartCheckInterval, r.RestartCheckInterval)
	}
	if !(r.MaxClockRateError > 0 && r.MaxClockRateError < 0.5) { // NaN too
		v.add("redlock.max_clock_rate_error", "must be in (0, 0.5), got %g", r.MaxClockRateError)
	}

	l := c.Locks
	minOK := v.positive("locks.min_ttl", l.MinTTL)
	if v.positive("locks.default_ttl", l.DefaultTTL) && minOK && l.DefaultTTL < l.MinTTL {
		v.add("locks.default_ttl", "must be >= locks.min_ttl (%v), got %v", l.MinTTL, l.DefaultTTL)
	}
	if v.positive("locks.max_ttl", l.MaxTTL) && l.MaxTTL < l.DefaultTTL {
		v.add("locks.max_ttl", "must be >= locks.default_ttl (%v), got %v", l.DefaultTTL, l.MaxTTL)
	} else if limit := maxTTLLimit(r.DriftFactor, r.DriftMin); driftOK && r.DriftMin >= 0 && l.MaxTTL > limit {
		// A restarted node is kept out for max_ttl plus drift on it
		// (backends/redis QuarantinePeriod): past the limit that sum
		// overflows to a negative period, and the node votes at once.
		v.add("locks.max_ttl", "must be at most %v (with redlock.drift_factor %g), so that a restarted node's quarantine, max_ttl plus drift, fits in a duration; got %v", limit, r.DriftFactor, l.MaxTTL)
	}
	// validity = ttl - elapsed - (ttl*drift_factor + drift_min): the
	// shortest lease must leave something even before any round trip.
	if minOK && driftOK && float64(l.MinTTL)*(1-r.DriftFactor) <= float64(r.DriftMin) {
		v.add("locks.min_ttl", "%v leaves no validity after drift (redlock.drift_factor %g, redlock.drift_min %v)", l.MinTTL, r.DriftFactor, r.DriftMin)
	}
	v.positive("locks.max_wait", l.MaxWait)
	if v.positive("locks.retry_min", l.RetryMin) && v.positive("locks.retry_max", l.RetryMax) && l.RetryMax < l.RetryMin {
		v.add("locks.retry_max", "must be >= locks.retry_min (%v), got %v", l.RetryMin, l.RetryMax)
	}
	v.positive("locks.keepalive_idle", l.KeepaliveIdle)
	v.between("locks.max_keepalive", l.MaxKeepalive, 1, -1)
	for i, item := range l.LockDelay {
		d, err := ParseLockDelay(item)
		switch {
		case err != nil:
			v.add(fmt.Sprintf("locks.lock_delay[%d]", i), "%v", err)
		case l.MaxTTL > 0 && d.Delay > l.MaxTTL:
			v.add(fmt.Sprintf("locks.lock_delay[%d]", i), "delay %v is above locks.max_ttl (%v)", d.Delay, l.MaxTTL)
		}
	}

	z := c.Zookeeper
	if c.Backend == BackendZookeeper && len(z.Servers) == 0 {
		v.add("zookeeper.servers", "at least one server is required with backend %s", BackendZookeeper)
	}
	v.addrs("zookeeper.servers", z.Servers)
	if !strings.HasPrefix(z.Root, "/") || path.Clean(z.Root) != z.Root {
		v.add("zookeeper.root", "must be a clean absolute path such as /lockproxy, got %q", z.Root)
	}
	if v.positive("zookeeper.session_timeout", z.SessionTimeout) && z.SessionTimeout > maxZookeeperSessionTimeout {
		v.add("zookeeper.session_timeout", "must be at most %v: the ZooKeeper client sends it as a 32-bit count of milliseconds, which holds no more; got %v", maxZookeeperSessionTimeout, z.SessionTimeout)
	}
	switch {
	case z.TickTime < 0:
		v.add("zookeeper.tick_time", "must not be negative, got %v", z.TickTime)
	case z.TickTime > 0 && z.SessionTimeout > 0 && z.SessionTimeout*2/3-z.TickTime/2 <= 0:
		v.add("zookeeper.tick_time", "%v leaves no validity with zookeeper.session_timeout %v (validity is capped at 2/3 of the session timeout less half a tick)", z.TickTime, z.SessionTimeout)
	case c.Backend == BackendZookeeper && z.SessionTimeout > 0 && driftOK && r.DriftMin >= 0:
		// The backend's validity: the lease capped by the session's
		// horizon, less drift on it (backends/zookeeper validityAt),
		// and below minZookeeperValidity no grant is answered.
		tick := z.TickTime
		if tick == 0 {
			tick = z.SessionTimeout / 2
		}
		horizon := z.SessionTimeout*2/3 - tick/2
		if float64(horizon)*(1-r.DriftFactor)-float64(r.DriftMin) < float64(minZookeeperValidity) {
			v.add("zookeeper.session_timeout", "%v leaves no validity: every lock is capped at %v (2/3 of it less half of zookeeper.tick_time, or 5/12 of it without one), and redlock.drift_factor %g and redlock.drift_min %v take all of that",
				z.SessionTimeout, horizon, r.DriftFactor, r.DriftMin)
		}
	}
	if user, _, ok := strings.Cut(z.Digest, ":"); z.Digest != "" && (!ok || user == "") {
		v.add("zookeeper.digest", "must be user:password")
	}

	pg := c.Postgres
	if c.Backend == BackendPostgres && strings.TrimSpace(pg.DSN) == "" {
		v.add("postgres.dsn", "a connection string is required with backend %s (postgres://user@host:5432/db or host=… dbname=…)", BackendPostgres)
	} else if c.Backend == BackendPostgres {
		if p := dsnProblem(pg.DSN); p != "" {
			v.add("postgres.dsn", "%s", p)
		}
	}
	if !identRE.MatchString(pg.Schema) || len(pg.Schema) > 63 {
		v.add("postgres.schema", "must be a lower-case SQL identifier such as public, got %q", pg.Schema)
	}
	if pg.TablePrefix != "" && (!identRE.MatchString(pg.TablePrefix) || len(pg.TablePrefix) > 40) {
		v.add("postgres.table_prefix", "must be a lower-case SQL identifier of at most 40 bytes such as lockproxy_, got %q", pg.TablePrefix)
	}
	v.between("postgres.pool_size", pg.PoolSize, 1, 1000)
	v.positive("postgres.sweep_interval", pg.SweepInterval)
	if v.positive("postgres.op_timeout", pg.OpTimeout) && pg.OpTimeout > maxPostgresOpTimeout {
		v.add("postgres.op_timeout", "must be at most %v: every grant sets PostgreSQL's idle_in_transaction_session_timeout to it, which takes no more; got %v", maxPostgresOpTimeout, pg.OpTimeout)
	}

	v.between("limits.max_clients", c.Limits.MaxClients, 1, -1)
	v.between("limits.max_key_bytes", c.Limits.MaxKeyBytes, 1, -1)
	v.between("limits.max_token_bytes", c.Limits.MaxTokenBytes, 1, -1)
	v.positive("limits.shutdown_timeout", c.Limits.ShutdownTimeout)
	if c.Limits.AuthTimeout < 0 {
		v.add("limits.auth_timeout", "must not be negative (0 disables it), got %v", c.Limits.AuthTimeout)
	}
	if c.Limits.MaxOutputBytes < 0 {
		v.add("limits.max_output_bytes", "must not be negative (0: no limit), got %d", c.Limits.MaxOutputBytes)
	}
	if c.Limits.MaxOutputBytesPubSub < 0 {
		v.add("limits.max_output_bytes_pubsub", "must not be negative (0: limits.max_output_bytes applies), got %d", c.Limits.MaxOutputBytesPubSub)
	}

	if len(v.problems) == 0 {
		return nil
	}
	return &ValidationError{Problems: v.problems}
}

// Warnings lists settings that are valid but likely not what an operator
// wants, each prefixed with its key path, for logging at start-up.
func (c Config) Warnings() []string {
	var w []string
	if c.Admin != "" && !loopbackAddr(c.Admin) {
		// Printed also when Validate refused admin, which may then be a
		// URL with a password.
		admin := hideCredentials(c.Admin)
		if c.AdminPprof {
			w = append(w, fmt.Sprintf("admin_pprof: /debug/pprof/ is served to every peer that reaches %s, not only to loopback", admin))
		} else {
			w = append(w, fmt.Sprintf("admin: %s is not a loopback address; /debug/pprof/ is served to loopback peers only (admin_pprof: true serves it to every peer)", admin))
		}
	}
	w = append(w, c.unknownEnv...)
	switch {
	case c.EmbeddedNodes():
		w = append(w, "dev: embedded in-process nodes are for trying out only; locks do not survive a restart")
	case c.Dev && c.Backend == BackendRedlock:
		// dev then starts nothing: an operator who believes the locks
		// are throwaway should learn they are on real nodes.
		w = append(w, "dev: redlock.nodes are given, so no embedded nodes start; the locks are on those nodes")
	case c.Dev:
		w = append(w, fmt.Sprintf("dev: the %s backend starts no embedded nodes; the locks are on its servers", c.Backend))
	}
	// Real nodes, --dev or not: one --dev --nodes host is as fragile as
	// one configured in a file.
	if n := len(c.Redlock.Nodes); c.Backend == BackendRedlock && n > 0 {
		switch {
		case n < 3:
			w = append(w, fmt.Sprintf("redlock.nodes: %d node(s) tolerate no node failure; use 3 or 5", n))
		case n%2 == 0:
			w = append(w, fmt.Sprintf("redlock.nodes: %d nodes tolerate %d failures, as %d would; an odd count is cheaper for the same safety", n, n/2-1, n-1))
		}
	}
	return w
}

// String renders the config as YAML, with secrets such as Redlock.Password
// replaced by "<redacted>" when set. It is meant for logs, not for reloading.
func (c Config) String() string {
	v := reflect.ValueOf(&c).Elem()
	for _, l := range leaves() {
		f := v.FieldByIndex(l.index)
		switch {
		case !l.secret:
		case f.Kind() == reflect.String && f.String() != "":
			f.SetString(redacted)
		case f.Kind() == reflect.Slice && f.Len() > 0:
			// A list of secrets (auth.users): one mark for the list, so
			// not even the number of entries shows.
			f.Set(reflect.ValueOf([]string{redacted}).Convert(f.Type()))
		}
	}
	var b bytes.Buffer
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	err := enc.Encode(c)
	if err == nil {
		err = enc.Close()
	}
	if err != nil {
		return "# conf: " + err.Error() + "\n"
	}
	return b.String()
}

// loopbackAddr reports whether the listen address addr binds to loopback
// only: localhost or a loopback IP. An empty host (every interface) or
// another name is not.
func loopbackAddr(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.Unmap().IsLoopback()
}

// maxTTLLimit is the longest locks.max_ttl whose quarantine period,
// max_ttl × (1 + driftFactor) + driftMin, fits in a time.Duration, with
// a margin for float64 rounding.
func maxTTLLimit(driftFactor float64, driftMin time.Duration) time.Duration {
	return time.Duration((0.999*float64(math.MaxInt64) - float64(driftMin)) / (1 + driftFactor))
}

// dsnProblem parses dsn as the PostgreSQL backend does at start (pgxpool,
// which reads the files the DSN names but opens no connection) and
// returns why it cannot, or "". The cause is a fixed text: pgx's errors
// quote the DSN, whose password its redaction can miss, and the problem
// is printed by check-config and to the journal.
func dsnProblem(dsn string) string {
	_, err := pgxpool.ParseConfig(dsn)
	var pe *fs.PathError
	switch {
	case err == nil:
		return ""
	case errors.As(err, &pe):
		return "cannot be parsed: a file it names (sslrootcert, sslcert, sslkey or a service file) cannot be read (the value is secret and not shown)"
	case strings.HasPrefix(dsn, "postgres://"), strings.HasPrefix(dsn, "postgresql://"):
		return "cannot be parsed: not a valid postgres:// URL, or a setting in it is invalid (reserved characters in the user name and password must be percent-encoded; the value is secret and not shown)"
	}
	return "cannot be parsed: not valid keyword=value settings, or a setting in it is invalid (a value with spaces or quotes goes in single quotes; the value is secret and not shown)"
}

// sameBind reports whether listeners on a and b, both host:port, would
// take the same socket: one port, and one host as nodeID spells it, or
// either of them every interface (Go listens there with one dual-stack
// socket, which any address on the port then clashes with). Names that
// only resolve alike (localhost and 127.0.0.1) are not caught. Addresses
// that do not parse are addr's to report.
func sameBind(a, b string) bool {
	ha, pa, errA := net.SplitHostPort(nodeID(a))
	hb, pb, errB := net.SplitHostPort(nodeID(b))
	if errA != nil || errB != nil || pa != pb {
		return false
	}
	if _, err := strconv.ParseUint(pa, 10, 16); err != nil {
		return false // not a port: addr says so
	}
	wildcard := func(h string) bool {
		ip, err := netip.ParseAddr(h)
		return h == "" || err == nil && ip.IsUnspecified()
	}
	return ha == hb || wildcard(ha) || wildcard(hb)
}

// dialsListener reports whether a dial to target (host:port) reaches a
// listener on listen: the same port, and the same host as nodeID spells
// it, or a loopback host (localhost, 127.0.0.0/8, ::1) when listen is on
// every interface. Another name or address of this host is not caught.
func dialsListener(target, listen string) bool {
	ht, pt, errT := net.SplitHostPort(nodeID(target))
	hl, pl, errL := net.SplitHostPort(nodeID(listen))
	if errT != nil || errL != nil || pt != pl {
		return false
	}
	if _, err := strconv.ParseUint(pt, 10, 16); err != nil {
		return false
	}
	if ht == hl {
		return true
	}
	ip, err := netip.ParseAddr(hl)
	return (hl == "" || err == nil && ip.IsUnspecified()) && loopbackAddr(net.JoinHostPort(ht, pt))
}

// validator collects problems in the order the checks run.
type validator struct {
	problems []string
}

func (v *validator) add(key, format string, args ...any) {
	v.problems = append(v.problems, key+": "+fmt.Sprintf(format, args...))
}

// positive reports d <= 0 and returns whether d is usable.
func (v *validator) positive(key string, d time.Duration) bool {
	if d <= 0 {
		v.add(key, "must be positive, got %v", d)
		return false
	}
	return true
}

// between checks lo <= n <= hi; hi < 0 means no upper bound.
func (v *validator) between(key string, n, lo, hi int) {
	switch {
	case hi < 0 && n < lo:
		v.add(key, "must be >= %d, got %d", lo, n)
	case hi >= 0 && (n < lo || n > hi):
		v.add(key, "must be in [%d, %d], got %d", lo, hi, n)
	}
}

func (v *validator) oneOf(key, s string, set ...string) {
	for _, ok := range set {
		if s == ok {
			return
		}
	}
	v.add(key, "must be one of %s; got %q", strings.Join(set, ", "), s)
}

// addrCredentials splits an address given as a URL
// (scheme://user:password@host:port/path?query) or with user info but no
// scheme (user:password@host:port), as Redis and PostgreSQL clients take
// them, into what may be shown of it and the host[:port] it names. ok is
// false for anything else: neither "://" nor "@" in s.
//
// Everything before the last '@' is user info, hidden whole: a password
// need not be percent-encoded for an operator to type it, so it may hold
// '/', '?' or '@' itself, and some clients (Lettuce) read
// "redis://secret@host" as a password alone, so the user name goes too.
// A query or fragment is hidden as well (redis://host?password=…). url.Parse
// is not used: it refuses a password with a bad %-escape, and an error
// must still not show it.
func addrCredentials(s string) (shown, hostPort, scheme string, ok bool) {
	rest := s
	if i := strings.Index(s, "://"); i >= 0 {
		scheme, rest = s[:i], s[i+len("://"):]
		shown = scheme + "://"
	}
	at := strings.LastIndexByte(rest, '@')
	if scheme == "" && at < 0 {
		return "", "", "", false
	}
	if at >= 0 {
		shown += redacted + "@"
		rest = rest[at+1:]
	}
	if i := strings.IndexAny(rest, "?#"); i >= 0 {
		rest = rest[:i]
		shown += rest + "?" + redacted
	} else {
		shown += rest
	}
	hostPort, _, _ = strings.Cut(rest, "/")
	return shown, hostPort, scheme, true
}

// hideCredentials returns s, or, when s is an address with user info or
// a scheme (addrCredentials), what may be shown of it; and, when s is
// something else that names a password (a PostgreSQL key=value DSN),
// "<redacted>". For messages that quote a value.
func hideCredentials(s string) string {
	if shown, _, _, ok := addrCredentials(s); ok {
		return shown
	}
	if l := strings.ToLower(s); strings.Contains(l, "password") || strings.Contains(l, "passwd") {
		return redacted
	}
	return s
}

// hidePathCredentials is hideCredentials for a value meant as a file
// path (the config file): a path may hold '@' (/etc/lockproxy@a/, as
// systemd instance names go), so only a URL or user@host:port is taken
// for an address.
func hidePathCredentials(s string) string {
	_, hostPort, scheme, ok := addrCredentials(s)
	if !ok {
		return s
	}
	if scheme == "" {
		// user:password@host:port: all of what follows the '@' is a
		// host and a numeric port.
		_, port, err := net.SplitHostPort(hostPort)
		if err != nil || hostPort != s[strings.LastIndexByte(s, '@')+1:] {
			return s
		}
		if _, err := strconv.ParseUint(port, 10, 16); err != nil {
			return s
		}
	}
	return hideCredentials(s)
}

// credentialKeys says, for an address key, where the user name and
// password that a URL would carry go instead, and which key turns on the
// TLS that rediss:// asks for; "" for keys (listeners) that take neither.
func credentialKeys(key string) (creds, tls string) {
	switch {
	case key == "upstream.address":
		return "the user name and password, if any, in upstream.username and upstream.password (LOCKPROXY_UPSTREAM_PASSWORD)", "upstream.tls.enabled"
	case strings.HasPrefix(key, "redlock.nodes"):
		return "the user name and password, if any, in redlock.username and redlock.password or redlock.password_file (LOCKPROXY_REDLOCK_PASSWORD)", "redlock.tls.enabled"
	case strings.HasPrefix(key, "zookeeper.servers"):
		return "the credentials, if any, in zookeeper.digest (user:password) or zookeeper.digest_file", ""
	}
	return "", ""
}

// addrURL reports, without the credentials, an address given as a URL or
// with user info, where addr wants host:port.
func (v *validator) addrURL(key, shown, hostPort, scheme string) {
	what := "a URL"
	if scheme == "" {
		what = "user info before the host"
	}
	give := "host:port"
	if h, p, err := net.SplitHostPort(hostPort); err == nil && h != "" && p != "" {
		give = hostPort
	}
	msg := fmt.Sprintf("want host:port, got %s, %q: give %s here", what, shown, give)
	creds, tls := credentialKeys(key)
	if creds != "" {
		msg += " and " + creds
	}
	if tls != "" && strings.EqualFold(scheme, "rediss") {
		msg += "; for the TLS that rediss:// means, set " + tls
	}
	v.add(key, "%s", msg)
}

// addr checks host:port with a numeric port in 1..65535. Listeners may
// leave the host empty (all interfaces); dial targets may not. A URL or
// user info is refused without being quoted: it may carry a password,
// and the problem is printed to the journal and by check-config.
func (v *validator) addr(key, s string, needHost bool) {
	if shown, hostPort, scheme, ok := addrCredentials(s); ok {
		v.addrURL(key, shown, hostPort, scheme)
		return
	}
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		var ae *net.AddrError
		if errors.As(err, &ae) {
			err = errors.New(ae.Err)
		}
		v.add(key, "want host:port, got %q (%v)", s, err)
		return
	}
	if needHost && host == "" {
		v.add(key, "want host:port, got %q (missing host)", s)
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		v.add(key, "port must be a number in 1..65535, got %q", port)
	}
}

// addrs checks each dial target and reports duplicates, which would let one
// node count twice towards a quorum. Addresses are compared as nodeID
// spells them, so that two spellings of one node are caught too.
func (v *validator) addrs(key string, list []string) {
	seen := make(map[string]int, len(list))
	for i, s := range list {
		k := fmt.Sprintf("%s[%d]", key, i)
		v.addr(k, s, true)
		id := nodeID(s)
		j, dup := seen[id]
		switch {
		case dup && list[j] == s:
			v.add(k, "duplicate of %s[%d] (%s)", key, j, hideCredentials(s))
		case dup:
			v.add(k, "duplicate of %s[%d]: %q and %q name the same node", key, j, hideCredentials(list[j]), hideCredentials(s))
		default:
			seen[id] = i
		}
	}
}

// nodeID is the form in which two dial targets that name the same node
// compare equal: the host lower-cased (DNS names are case-insensitive),
// an IP literal in its canonical form with an IPv4-mapped IPv6 address
// unmapped (the dialer connects to the same IPv4 host), and the port as
// a number ("06379" is 6379). Names that only resolve to the same address
// (localhost and 127.0.0.1) cannot be told apart without DNS and are not
// caught. A trailing dot is kept: "redis-a." is absolute, while "redis-a"
// may be completed by a search domain to another host. A target that does
// not parse is compared as written; addr reports it.
func nodeID(s string) string {
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return s
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return s
	}
	// An IPv6 zone is an interface name, which is case-sensitive: IP
	// literals are canonicalised, not lower-cased.
	if ip, err := netip.ParseAddr(host); err == nil {
		host = ip.Unmap().String()
	} else {
		host = strings.ToLower(host)
	}
	return net.JoinHostPort(host, strconv.FormatUint(p, 10))
}
