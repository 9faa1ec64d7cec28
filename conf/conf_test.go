package conf

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/test/harness"
)

// writeFile writes content to name in a fresh temporary directory.
func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// problems returns the problem lines of err, or nil.
func problems(t *testing.T, err error) []string {
	t.Helper()
	if err == nil {
		return nil
	}
	var ve *ValidationError
	if !errors.As(err, &ve) {
		t.Fatalf("error %q is not a *ValidationError", err)
	}
	if got := ve.Error(); got != strings.Join(ve.Problems, "\n") {
		t.Errorf("Error() = %q; want the problems one per line", got)
	}
	return ve.Problems
}

func TestDefaultValidate(t *testing.T) {
	tests := []struct {
		name string
		edit func(*Config)
		want []string
	}{
		{"dev", func(c *Config) { c.Dev = true }, nil},
		{"no nodes", func(c *Config) {}, []string{
			"redlock.nodes: at least one node is required (or use --dev)",
		}},
		{"three nodes", func(c *Config) { c.Redlock.Nodes = []string{"a:6379", "b:6379", "c:6379"} }, nil},
		{"zookeeper needs no redlock nodes", func(c *Config) {
			c.Backend = BackendZookeeper
			c.Zookeeper.Servers = []string{"zk1:2181"}
		}, nil},
		{"postgres needs no redlock nodes", func(c *Config) {
			c.Backend = BackendPostgres
			c.Postgres.DSN = "postgres://lp@db:5432/locks"
		}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Default()
			tt.edit(&c)
			if got := problems(t, c.Validate()); !slices.Equal(got, tt.want) {
				t.Errorf("Validate() = %q; want %q", got, tt.want)
			}
		})
	}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name string
		edit func(*Config)
		want []string
	}{
		{"addresses", func(c *Config) {
			c.Listen = "7380"
			c.Admin = ":0"
			c.Upstream.Address = ":6379"
			c.Redlock.Nodes = []string{"a:6379", "b:http", "a:6379", "c:70000"}
		}, []string{
			`listen: want host:port, got "7380" (missing port in address)`,
			`admin: port must be a number in 1..65535, got "0"`,
			`upstream.address: want host:port, got ":6379" (missing host)`,
			`redlock.nodes[1]: port must be a number in 1..65535, got "http"`,
			`redlock.nodes[2]: duplicate of redlock.nodes[0] (a:6379)`,
			`redlock.nodes[3]: port must be a number in 1..65535, got "70000"`,
		}},
		{"admin empty disables", func(c *Config) { c.Admin = "" }, nil},
		{"procs auto", func(c *Config) { c.Procs = ProcsAuto }, nil},
		{"procs fixed", func(c *Config) { c.Procs = "4" }, nil},
		{"procs zero", func(c *Config) { c.Procs = "0" }, []string{
			`procs: must be auto or a number of threads from 1 to 1024, got "0"`,
		}},
		{"procs words", func(c *Config) { c.Procs = "max" }, []string{
			`procs: must be auto or a number of threads from 1 to 1024, got "max"`,
		}},
		{"procs too many", func(c *Config) { c.Procs = "100000" }, []string{
			`procs: must be auto or a number of threads from 1 to 1024, got "100000"`,
		}},
		{"auth timeout", func(c *Config) { c.Limits.AuthTimeout = -time.Second }, []string{
			`limits.auth_timeout: must not be negative (0 disables it), got -1s`,
		}},
		{"auth timeout off", func(c *Config) { c.Limits.AuthTimeout = 0 }, nil},
		{"output limit", func(c *Config) { c.Limits.MaxOutputBytes = -1 }, []string{
			`limits.max_output_bytes: must not be negative (0: no limit), got -1`,
		}},
		{"output limit off", func(c *Config) { c.Limits.MaxOutputBytes = 0 }, nil},
		{"pub/sub output limit", func(c *Config) { c.Limits.MaxOutputBytesPubSub = -1 }, []string{
			`limits.max_output_bytes_pubsub: must not be negative (0: limits.max_output_bytes applies), got -1`,
		}},
		{"permissions", func(c *Config) {
			c.Auth.Password = "pw"
			c.Auth.Users = []string{"app:pw", "ops:pw"}
			c.Auth.Permissions = []string{
				"app ~app:* +@lock +get", "default +@all", "ops ~[ +get", "ops +@nosuch", "ops ~x -get",
				"nobody +get", "app +set", "lonely",
			}
		}, []string{
			`auth.permissions[2]: invalid key glob "[": syntax error in pattern`,
			`auth.permissions[3]: unknown category "@nosuch": lockproxy knows @all, @lock and Redis's ACL categories (@read, @write, @keyspace, @dangerous, …)`,
			`auth.permissions[4]: no +command rule: the user could run nothing (+@all for every command)`,
			`auth.permissions[5]: user "nobody" is not in auth.users (or auth.password, for default)`,
			`auth.permissions[6]: user "app" has permissions twice`,
			`auth.permissions[7]: want "user ~glob… +command…", with at least one rule`,
		}},
		{"users", func(c *Config) {
			c.Auth.Users = []string{"alice:pw", "bob:a:b", "nopass", ":pw", "alice:other", "default:pw", "a b:pw", "carol:"}
		}, []string{
			`auth.users[2]: want "name:password" with both parts non-empty`,
			`auth.users[3]: want "name:password" with both parts non-empty`,
			`auth.users[4]: user "alice" is listed twice`,
			`auth.users[5]: the default user's password is auth.password`,
			`auth.users[6]: the user name must not contain spaces`,
			`auth.users[7]: want "name:password" with both parts non-empty`,
		}},
		{"listen on all interfaces", func(c *Config) { c.Listen = ":7380" }, nil},
		{"ipv6", func(c *Config) { c.Redlock.Nodes = []string{"[::1]:6379"} }, nil},
		{"enums", func(c *Config) {
			c.Backend = "etcd"
			c.Log.Level = "trace"
			c.Log.Format = "text"
		}, []string{
			`backend: must be redlock, zookeeper or postgres, got "etcd"`,
			`log.level: must be one of debug, info, warn, error; got "trace"`,
			`log.format: must be one of json, console; got "text"`,
		}},
		{"zookeeper", func(c *Config) {
			c.Backend = BackendZookeeper
			c.Zookeeper.Root = "lockproxy/"
			c.Zookeeper.SessionTimeout = 0
			c.Zookeeper.Digest = "nocolon"
		}, []string{
			"zookeeper.servers: at least one server is required with backend zookeeper",
			`zookeeper.root: must be a clean absolute path such as /lockproxy, got "lockproxy/"`,
			"zookeeper.session_timeout: must be positive, got 0s",
			"zookeeper.digest: must be user:password",
		}},
		{"zookeeper tick", func(c *Config) { c.Zookeeper.TickTime = -time.Second }, []string{
			"zookeeper.tick_time: must not be negative, got -1s",
		}},
		{"zookeeper tick past the session", func(c *Config) {
			c.Zookeeper.SessionTimeout, c.Zookeeper.TickTime = 3*time.Second, 4*time.Second
		}, []string{
			"zookeeper.tick_time: 4s leaves no validity with zookeeper.session_timeout 3s (validity is capped at 2/3 of the session timeout less half a tick)",
		}},
		{"zookeeper session timeout past 32-bit milliseconds", func(c *Config) {
			c.Zookeeper.SessionTimeout = math.MaxInt32*time.Millisecond + time.Millisecond
		}, []string{
			"zookeeper.session_timeout: must be at most 596h31m23.647s: the ZooKeeper client sends it as a 32-bit count of milliseconds, which holds no more; got 596h31m23.648s",
		}},
		{"zookeeper session timeout at the bound", func(c *Config) { c.Zookeeper.SessionTimeout = math.MaxInt32 * time.Millisecond }, nil},
		{"postgres", func(c *Config) {
			c.Backend = BackendPostgres
			c.Postgres.DSN = " "
			c.Postgres.Schema = "Locks"
			c.Postgres.TablePrefix = "lock-"
			c.Postgres.PoolSize = 0
			c.Postgres.SweepInterval = 0
			c.Postgres.OpTimeout = -time.Second
		}, []string{
			"postgres.dsn: a connection string is required with backend postgres (postgres://user@host:5432/db or host=… dbname=…)",
			`postgres.schema: must be a lower-case SQL identifier such as public, got "Locks"`,
			`postgres.table_prefix: must be a lower-case SQL identifier of at most 40 bytes such as lockproxy_, got "lock-"`,
			"postgres.pool_size: must be in [1, 1000], got 0",
			"postgres.sweep_interval: must be positive, got 0s",
			"postgres.op_timeout: must be positive, got -1s",
		}},
		{"postgres op timeout past idle_in_transaction_session_timeout", func(c *Config) {
			c.Postgres.OpTimeout = math.MaxInt32*time.Millisecond + time.Millisecond
		}, []string{
			"postgres.op_timeout: must be at most 596h31m23.647s: every grant sets PostgreSQL's idle_in_transaction_session_timeout to it, which takes no more; got 596h31m23.648s",
		}},
		{"postgres op timeout at the bound", func(c *Config) { c.Postgres.OpTimeout = math.MaxInt32 * time.Millisecond }, nil},
		{"lock patterns", func(c *Config) { c.LockPatterns = []string{"lock:*", "", "bad[", "a\\"} }, []string{
			"lock_patterns[1]: must not be empty",
			`lock_patterns[2]: invalid glob "bad[": syntax error in pattern`,
			`lock_patterns[3]: invalid glob "a\\": syntax error in pattern`,
		}},
		{"lock delay", func(c *Config) {
			c.Locks.LockDelay = []string{"order:*=5s", "nodelay", "x=-1s", "bad[=1s", "long:*=1h"}
		}, []string{
			`locks.lock_delay[1]: want pattern=duration such as 'order:*=5s', got "nodelay"`,
			`locks.lock_delay[2]: want a positive duration after '=' in "x=-1s"`,
			`locks.lock_delay[3]: bad pattern "bad[": syntax error in pattern`,
			"locks.lock_delay[4]: delay 1h0m0s is above locks.max_ttl (10m0s)",
		}},
		{"redlock numbers", func(c *Config) {
			c.Redlock.KeyPrefix = ""
			c.Redlock.DriftFactor = 0.7
			c.Redlock.DriftMin = -time.Millisecond
			c.Redlock.NodeTimeoutFactor = 1
			c.Redlock.NodeTimeoutMin = 300 * time.Millisecond
			c.Redlock.PoolSize = 0
			c.Redlock.PipelineWorkers = 65
			c.Redlock.MaxBatch = 0
			c.Redlock.DialTimeout = 0
			c.Redlock.RestartCheckInterval = 100 * time.Millisecond
			c.Redlock.MaxClockRateError = 0.5
		}, []string{
			"redlock.key_prefix: must not be empty",
			"redlock.drift_factor: must be in [0, 0.5), got 0.7",
			"redlock.drift_min: must not be negative, got -1ms",
			"redlock.node_timeout_factor: must be in (0, 1), got 1",
			"redlock.node_timeout_max: must be >= redlock.node_timeout_min (300ms), got 250ms",
			"redlock.pool_size: must be >= 1, got 0",
			"redlock.pipeline_workers: must be in [1, 64], got 65",
			"redlock.max_batch: must be in [1, 10000], got 0",
			"redlock.dial_timeout: must be positive, got 0s",
			"redlock.restart_check_interval: must be in [250ms, 5s], got 100ms",
			"redlock.max_clock_rate_error: must be in (0, 0.5), got 0.5",
		}},
		{"clock rate bound zero", func(c *Config) { c.Redlock.MaxClockRateError = 0 }, []string{
			"redlock.max_clock_rate_error: must be in (0, 0.5), got 0",
		}},
		{"lock durations", func(c *Config) {
			c.Locks.DefaultTTL = 20 * time.Minute
			c.Locks.MinTTL = 2 * time.Millisecond
			c.Locks.MaxWait = 0
			c.Locks.RetryMin = time.Second
			c.Locks.KeepaliveIdle = 0
		}, []string{
			"locks.max_ttl: must be >= locks.default_ttl (20m0s), got 10m0s",
			"locks.min_ttl: 2ms leaves no validity after drift (redlock.drift_factor 0.01, redlock.drift_min 2ms)",
			"locks.max_wait: must be positive, got 0s",
			"locks.retry_max: must be >= locks.retry_min (1s), got 200ms",
			"locks.keepalive_idle: must be positive, got 0s",
		}},
		{"default below min", func(c *Config) { c.Locks.DefaultTTL = 5 * time.Millisecond }, []string{
			"locks.default_ttl: must be >= locks.min_ttl (10ms), got 5ms",
		}},
		{"limits", func(c *Config) {
			c.Limits = Limits{MaxClients: -1}
		}, []string{
			"limits.max_clients: must be >= 1, got -1",
			"limits.max_key_bytes: must be >= 1, got 0",
			"limits.max_token_bytes: must be >= 1, got 0",
			"limits.shutdown_timeout: must be positive, got 0s",
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Default()
			c.Dev = true
			tt.edit(&c)
			got := problems(t, c.Validate())
			if !slices.Equal(got, tt.want) {
				t.Errorf("Validate() =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(tt.want, "\n"))
			}
		})
	}
}

func TestWarnings(t *testing.T) {
	tests := []struct {
		name  string
		nodes []string
		dev   bool
		want  int
	}{
		{"three", []string{"a:1", "b:1", "c:1"}, false, 0},
		{"four", []string{"a:1", "b:1", "c:1", "d:1"}, false, 1},
		{"one", []string{"a:1"}, false, 1},
		{"dev", nil, true, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Default()
			c.Dev = tt.dev
			c.Redlock.Nodes = tt.nodes
			if got := c.Warnings(); len(got) != tt.want {
				t.Errorf("Warnings() = %q; want %d", got, tt.want)
			}
		})
	}
}

func TestLoad(t *testing.T) {
	tests := []struct {
		name string
		yaml string
		want func(*Config) // edits Default() into the expected result
		errs []string      // expected problems, file:line stripped
		err  string        // expected substring of a non-validation error
	}{
		{"empty", "", func(*Config) {}, nil, ""},
		{"comments only", "# nothing\n", func(*Config) {}, nil, ""},
		{"values", `
listen: 0.0.0.0:7380
dev: true
lock_patterns: ["lock:*", "mutex:*"]
redlock:
  nodes: [a:6379, b:6379, c:6379]
  drift_factor: 0.02
  node_timeout_max: 1s
locks:
  default_ttl: 1m30s
  retry_min: 50ms
`, func(c *Config) {
			c.Listen = "0.0.0.0:7380"
			c.Dev = true
			c.LockPatterns = []string{"lock:*", "mutex:*"}
			c.Redlock.Nodes = []string{"a:6379", "b:6379", "c:6379"}
			c.Redlock.DriftFactor = 0.02
			c.Redlock.NodeTimeoutMax = time.Second
			c.Locks.DefaultTTL = 90 * time.Second
			c.Locks.RetryMin = 50 * time.Millisecond
		}, nil, ""},
		{"null section keeps defaults", "redlock:\nlocks: ~\n", func(*Config) {}, nil, ""},
		// procs is "auto" or a number; YAML reads a bare number as one.
		{"procs number", "procs: 2\n", func(c *Config) { c.Procs = "2" }, nil, ""},
		{"procs auto", "procs: auto\n", func(c *Config) { c.Procs = "auto" }, nil, ""},
		{"anchor under an unknown key", `
base: &b
  level: debug
  format: console
`, nil, []string{"base: unknown key"}, ""},
		{"merge into section", `
log:
  <<: {level: debug, format: console}
  format: json
`, func(c *Config) { c.Log.Level = "debug" }, nil, ""},
		{"unknown nested key", "redlock:\n  nodez: [a:1]\n", nil, []string{"redlock.nodez: unknown key"}, ""},
		{"every problem at once", `
listen: 1.2.3.4:1
lsiten: x
redlock:
  drift_factor: lots
  nodez: []
  drift_min: 2
locks:
  default_ttl: 30x
limits: 5
`, nil, []string{
			"lsiten: unknown key",
			"redlock.drift_factor: cannot unmarshal !!str `lots` into float64",
			"redlock.nodez: unknown key",
			"redlock.drift_min: cannot unmarshal !!int `2` into time.Duration; want a duration such as \"250ms\" or \"30s\"",
			"locks.default_ttl: cannot unmarshal !!str `30x` into time.Duration; want a duration such as \"250ms\" or \"30s\"",
			`limits: want a mapping, got !!int "5"`,
		}, ""},
		{"duplicate key", "listen: a:1\nlisten: b:2\n", nil, []string{"listen: duplicate key, first set on line 1"}, ""},
		{"not a mapping", "- a\n- b\n", nil, []string{"(top level): want a mapping, got a list"}, ""},
		{"syntax error", "listen: [\n", nil, nil, "yaml:"},
		{"two documents", "listen: a:1\n---\nlisten: b:2\n", nil, nil, "only one YAML document"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := writeFile(t, "lockproxy.yaml", tt.yaml)
			got, err := Load(p)
			switch {
			case tt.err != "":
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("Load = %v; want error containing %q", err, tt.err)
				}
				return
			case tt.errs != nil:
				var lines []string
				for _, pr := range problems(t, err) {
					i := strings.LastIndex(pr, " (")
					if i < 0 || !strings.HasPrefix(pr[i:], " ("+p+":") {
						t.Errorf("problem %q does not end with (%s:LINE)", pr, p)
						i = len(pr)
					}
					lines = append(lines, pr[:i])
				}
				if !slices.Equal(lines, tt.errs) {
					t.Errorf("Load problems =\n%s\nwant\n%s", strings.Join(lines, "\n"), strings.Join(tt.errs, "\n"))
				}
				return
			case err != nil:
				t.Fatalf("Load = %v; want no error", err)
			}
			want := Default()
			tt.want(&want)
			if !reflect.DeepEqual(got, want) {
				t.Errorf("Load =\n%v\nwant\n%v", got, want)
			}
		})
	}
}

func TestLoadMissingFile(t *testing.T) {
	_, err := Load(filepath.Join(t.TempDir(), "nope.yaml"))
	if !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Load(missing) = %v; want os.ErrNotExist", err)
	}
}

func TestLoadUnknownKeyLine(t *testing.T) {
	p := writeFile(t, "c.yaml", "redlock:\n  key_prefix: x\n  nodez: [a:1]\n")
	_, err := Load(p)
	want := "redlock.nodez: unknown key (" + p + ":3)"
	if err == nil || err.Error() != want {
		t.Errorf("Load = %v; want %q", err, want)
	}
}

func TestFromArgs(t *testing.T) {
	const file = `
listen: 127.0.0.1:1001
admin: 127.0.0.1:2001
upstream: up:6379
redlock:
  nodes: [file:1]
  drift_factor: 0.03
locks:
  default_ttl: 1s
  max_ttl: 1m
`
	tests := []struct {
		name  string
		args  []string // "FILE" is replaced by the file's path
		env   []string
		check func(*Config) []string // returns mismatches
	}{
		{"file only", []string{"FILE"}, nil, expect(map[string]any{
			"listen": "127.0.0.1:1001", "redlock.nodes": []string{"file:1"}, "redlock.drift_factor": 0.03,
		})},
		{"env over file", []string{"-c", "FILE"}, []string{
			"LOCKPROXY_LISTEN=127.0.0.1:1002",
			"LOCKPROXY_REDLOCK_NODES=env1:1, env2:2,,",
			"LOCKPROXY_REDLOCK_DRIFT_FACTOR=0.04",
			"LOCKPROXY_LOCKS_DEFAULT_TTL=2s",
			"LOCKPROXY_LOCKS_KEEPALIVE_IDLE=1500ms",
			"LOCKPROXY_ADMIN=",
			"LOCKPROXY_DEV=true",
			"LOCKPROXY_NO_SUCH_KEY=ignored",
		}, expect(map[string]any{
			"listen": "127.0.0.1:1002", "admin": "", "dev": true,
			"redlock.nodes": []string{"env1:1", "env2:2"}, "redlock.drift_factor": 0.04,
			"locks.default_ttl": 2 * time.Second, "locks.max_ttl": time.Minute, "upstream.address": "up:6379",
			"locks.keepalive_idle": 1500 * time.Millisecond,
		})},
		{"flags over env", []string{
			"--config", "FILE", "--listen", "127.0.0.1:1003", "-nodes=f1:1,f2:2", "--nodes", "f3:3",
			"--drift-factor", "0.05", "--default-ttl=3s", "--lock-pattern", "a:*", "-lock-pattern", "b,c:*",
			"--log-level", "debug", "--zk", "z:2181", "--backend", "zookeeper", "--max-ttl", "5m",
		}, []string{
			"LOCKPROXY_LISTEN=127.0.0.1:1002",
			"LOCKPROXY_REDLOCK_NODES=env1:1",
			"LOCKPROXY_REDLOCK_DRIFT_FACTOR=0.04",
			"LOCKPROXY_LOCK_PATTERNS=env:*",
		}, expect(map[string]any{
			"listen": "127.0.0.1:1003", "redlock.nodes": []string{"f1:1", "f2:2", "f3:3"},
			"redlock.drift_factor": 0.05, "locks.default_ttl": 3 * time.Second, "locks.max_ttl": 5 * time.Minute,
			"lock_patterns": []string{"a:*", "b,c:*"}, "log.level": "debug",
			"zookeeper.servers": []string{"z:2181"}, "backend": "zookeeper", "admin": "127.0.0.1:2001",
		})},
		{"positional between flags", []string{"--dev", "FILE", "--upstream", "u:1"}, nil, expect(map[string]any{
			"dev": true, "upstream.address": "u:1", "listen": "127.0.0.1:1001",
		})},
		{"LOCKPROXY_CONFIG", nil, []string{"LOCKPROXY_CONFIG=FILE"}, expect(map[string]any{"listen": "127.0.0.1:1001"})},
		{"no file", []string{"--dev"}, []string{"PATH=/bin", "LOCKPROXY_LOG_FORMAT=console"}, expect(map[string]any{
			"dev": true, "listen": "127.0.0.1:7380", "log.format": "console",
		})},
		{"after --", []string{"--dev", "--", "FILE"}, nil, expect(map[string]any{"listen": "127.0.0.1:1001"})},
		{"dev=false overrides env", []string{"--dev=false"}, []string{"LOCKPROXY_DEV=1"}, expect(map[string]any{"dev": false})},
		{"procs", nil, []string{"LOCKPROXY_PROCS=3"}, expect(map[string]any{"procs": "3"})},
		{"procs flag over env", []string{"--procs", "1"}, []string{"LOCKPROXY_PROCS=3"}, expect(map[string]any{"procs": "1"})},
		{"empty list flag clears", []string{"FILE", "--nodes", ""}, nil, expect(map[string]any{"redlock.nodes": []string{}})},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := writeFile(t, "lockproxy.yaml", file)
			c, err := FromArgs(subst(tt.args, p), subst(tt.env, p))
			if err != nil {
				t.Fatalf("FromArgs = %v", err)
			}
			for _, m := range tt.check(&c) {
				t.Error(m)
			}
		})
	}
}

// subst replaces "FILE" (alone or after "=") with p.
func subst(list []string, p string) []string {
	out := make([]string, len(list))
	for i, s := range list {
		out[i] = strings.ReplaceAll(s, "FILE", p)
	}
	return out
}

// expect checks config values by key path.
func expect(want map[string]any) func(*Config) []string {
	return func(c *Config) []string {
		var bad []string
		v := reflect.ValueOf(c).Elem()
		for path, w := range want {
			l, ok := leafByPath(path)
			if !ok {
				bad = append(bad, "no key "+path)
				continue
			}
			got := v.FieldByIndex(l.index).Interface()
			if !reflect.DeepEqual(got, w) {
				bad = append(bad, path+" = "+fmt.Sprintf("%#v", got)+"; want "+fmt.Sprintf("%#v", w))
			}
		}
		slices.Sort(bad)
		return bad
	}
}

func TestFromArgsErrors(t *testing.T) {
	tests := []struct {
		name string
		args []string
		env  []string
		want []string // substrings of the error, in any line
		help bool
	}{
		{"bad env value", nil, []string{"LOCKPROXY_REDLOCK_DRIFT_FACTOR=abc"}, []string{
			`LOCKPROXY_REDLOCK_DRIFT_FACTOR: invalid value "abc" for redlock.drift_factor: want a number`,
		}, false},
		{"every bad env value", nil, []string{
			"LOCKPROXY_DEV=maybe", "LOCKPROXY_LOCKS_MAX_TTL=10", "LOCKPROXY_LIMITS_MAX_CLIENTS=lots",
		}, []string{
			"LOCKPROXY_DEV: invalid value \"maybe\" for dev: want true or false",
			"LOCKPROXY_LOCKS_MAX_TTL: invalid value \"10\" for locks.max_ttl: want a duration",
			"LOCKPROXY_LIMITS_MAX_CLIENTS: invalid value \"lots\" for limits.max_clients: want an integer",
		}, false},
		{"file and env problems together", []string{"FILE"}, []string{"LOCKPROXY_DEV=maybe"}, []string{
			"redlock.nodez: unknown key", "LOCKPROXY_DEV: invalid value",
		}, false},
		{"bad flag value", []string{"--drift-factor", "x"}, nil, []string{
			`conf: invalid value "x" for flag -drift-factor: want a number`,
		}, false},
		{"bad duration flag", []string{"--max-ttl=10"}, nil, []string{`for flag -max-ttl: want a duration`}, false},
		{"unknown flag", []string{"--nope"}, nil, []string{"flag provided but not defined: -nope"}, false},
		{"two files", []string{"a.yaml", "b.yaml"}, nil, []string{"at most one config file"}, false},
		{"-c and positional", []string{"-c", "a.yaml", "b.yaml"}, nil, []string{"config file given twice"}, false},
		{"missing file", []string{"--config", "/nonexistent/lockproxy.yaml"}, nil, []string{"no such file"}, false},
		{"help", []string{"--help"}, nil, []string{"Usage: lockproxy", "-nodes host:port,...", "LOCKPROXY_"}, true},
		{"-h", []string{"-h"}, nil, []string{"-lock-pattern glob"}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := writeFile(t, "bad.yaml", "redlock:\n  nodez: []\n")
			_, err := FromArgs(subst(tt.args, p), tt.env)
			if err == nil {
				t.Fatalf("FromArgs(%q) = nil error; want %q", tt.args, tt.want)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("FromArgs(%q) = %q; want it to contain %q", tt.args, err, w)
				}
			}
			if got := errors.Is(err, flag.ErrHelp); got != tt.help {
				t.Errorf("errors.Is(err, flag.ErrHelp) = %v; want %v", got, tt.help)
			}
		})
	}
}

func TestZookeeperDigestFile(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "digest"), []byte("lp:s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "c.yaml")
	if err := os.WriteFile(p, []byte("backend: zookeeper\nzookeeper: {servers: [z:2181], digest_file: digest}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := FromArgs([]string{p}, nil)
	if err != nil {
		t.Fatalf("FromArgs = %v", err)
	}
	if c.Zookeeper.Digest != "lp:s3cret" {
		t.Errorf("zookeeper.digest = %q; want it read from the file", c.Zookeeper.Digest)
	}
	if strings.Contains(c.String(), "s3cret") {
		t.Errorf("String() shows the digest:\n%s", c)
	}
	// The environment is above the file, however either gives the digest.
	if c, err := FromArgs([]string{p}, []string{"LOCKPROXY_ZOOKEEPER_DIGEST=a:b"}); err != nil || c.Zookeeper.Digest != "a:b" {
		t.Errorf("env digest over the file's digest_file = %q, %v; want the env's", c.Zookeeper.Digest, err)
	}
}

// TestPostgresDSN: the DSN comes from the flag, the environment or a
// file, and String never shows it (it may hold the password).
func TestPostgresDSN(t *testing.T) {
	dsn := "postgres://lp:s3cret@db:5432/locks"
	for _, tt := range []struct {
		name string
		args []string
		env  []string
	}{
		{"flag", []string{"--backend", "postgres", "--postgres-dsn", dsn}, nil},
		{"env", []string{"--backend", "postgres"}, []string{"LOCKPROXY_POSTGRES_DSN=" + dsn}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c, err := FromArgs(tt.args, tt.env)
			if err != nil {
				t.Fatalf("FromArgs = %v", err)
			}
			if c.Backend != BackendPostgres || c.Postgres.DSN != dsn {
				t.Errorf("backend %q, dsn %q; want postgres, %q", c.Backend, c.Postgres.DSN, dsn)
			}
			if s := c.String(); strings.Contains(s, "s3cret") || !strings.Contains(s, "dsn: <redacted>") {
				t.Errorf("String() shows the DSN or no redaction mark:\n%s", s)
			}
		})
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "dsn"), []byte(dsn+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "c.yaml")
	if err := os.WriteFile(p, []byte("backend: postgres\npostgres: {dsn_file: dsn, table_prefix: app_}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := FromArgs([]string{p}, nil)
	if err != nil {
		t.Fatalf("FromArgs = %v", err)
	}
	if c.Postgres.DSN != dsn || c.Postgres.TablePrefix != "app_" || c.Postgres.Schema != "public" {
		t.Errorf("postgres = %+v; want the DSN from the file, prefix app_, schema public", c.Postgres)
	}
	c, err = FromArgs([]string{"--backend", "postgres"}, nil)
	if err == nil {
		err = c.Validate()
	}
	if err == nil || !strings.Contains(err.Error(), "postgres.dsn: a connection string is required") {
		t.Errorf("no DSN = %v; want postgres.dsn named", err)
	}
}

func TestPasswordFile(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "secret"), []byte("s3 cret\r\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "empty"), []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	conf := func(body string) string {
		p := filepath.Join(dir, "c.yaml")
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	tests := []struct {
		name string
		file string // YAML body
		env  []string
		want string // password, or error substring when err
		err  bool
	}{
		{"relative to the file", "redlock: {password_file: secret}", nil, "s3 cret", false},
		{"absolute from env", "", []string{"LOCKPROXY_REDLOCK_PASSWORD_FILE=" + filepath.Join(dir, "secret")}, "s3 cret", false},
		{"plain password", "redlock: {password: pw}", nil, "pw", false},
		{"env password over file password", "redlock: {password: pw}", []string{"LOCKPROXY_REDLOCK_PASSWORD=pw2"}, "pw2", false},
		{"both set", "redlock: {password: pw, password_file: secret}", nil, "both set", true},
		// flags > env > file: the env's file replaces the file's password
		// (TestSecretPrecedence has every pair and layer).
		{"env file over file password", "redlock: {password: pw}", []string{"LOCKPROXY_REDLOCK_PASSWORD_FILE=" + filepath.Join(dir, "secret")}, "s3 cret", false},
		{"missing", "redlock: {password_file: nope}", nil, "redlock.password_file: open", true},
		{"empty", "redlock: {password_file: empty}", nil, "is empty", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := FromArgs([]string{"--dev", conf(tt.file)}, tt.env)
			if tt.err {
				if err == nil || !strings.Contains(err.Error(), tt.want) {
					t.Fatalf("FromArgs = %v; want error containing %q", err, tt.want)
				}
				return
			}
			if err != nil {
				t.Fatalf("FromArgs = %v", err)
			}
			if c.Redlock.Password != tt.want {
				t.Errorf("Password = %q; want %q", c.Redlock.Password, tt.want)
			}
		})
	}
}

func TestString(t *testing.T) {
	tests := []struct {
		name     string
		password string
		want     []string // substrings
		not      []string
	}{
		{"redacted", "hunter2", []string{"password: <redacted>", "drift_min: 2ms", "default_ttl: 30s", "listen: 127.0.0.1:7380"}, []string{"hunter2"}},
		{"empty stays empty", "", []string{`password: ""`}, []string{"<redacted>"}},
		{"users redacted", "", []string{"users:\n    - <redacted>\n"}, []string{"alice", "pw1", "bob"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Default()
			c.Redlock.Password = tt.password
			if tt.name == "users redacted" {
				c.Auth.Users = []string{"alice:pw1", "bob:pw2"}
				defer func() {
					if c.Auth.Users[0] != "alice:pw1" {
						t.Errorf("String() changed auth.users to %q", c.Auth.Users)
					}
				}()
			}
			s := c.String()
			for _, w := range tt.want {
				if !strings.Contains(s, w) {
					t.Errorf("String() lacks %q:\n%s", w, s)
				}
			}
			for _, n := range tt.not {
				if strings.Contains(s, n) {
					t.Errorf("String() contains %q:\n%s", n, s)
				}
			}
			if c.Redlock.Password != tt.password {
				t.Errorf("String() changed Password to %q", c.Redlock.Password)
			}
		})
	}
}

func TestRestartCheckEvery(t *testing.T) {
	for _, tc := range []struct {
		name     string
		interval time.Duration
		maxTTL   time.Duration
		want     time.Duration
	}{
		{"default", time.Second, 10 * time.Minute, time.Second},
		{"quarter of max ttl", time.Second, 3 * time.Second, 750 * time.Millisecond},
		{"floor", time.Second, 20 * time.Millisecond, 10 * time.Millisecond},
		{"slow", 5 * time.Second, time.Hour, 5 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Default()
			c.Redlock.RestartCheckInterval = tc.interval
			c.Locks.MaxTTL = tc.maxTTL
			if got := c.RestartCheckEvery(); got != tc.want {
				t.Errorf("RestartCheckEvery(interval %v, max_ttl %v) = %v; want %v", tc.interval, tc.maxTTL, got, tc.want)
			}
		})
	}
}

// TestStringRoundTrip checks that String's YAML loads back to the same
// config, so every field has a yaml tag Load accepts.
func TestStringRoundTrip(t *testing.T) {
	c := Default()
	c.Dev = true
	c.LockPatterns = []string{"lock:*"}
	c.Redlock.Nodes = []string{"a:1", "b:2"}
	c.Zookeeper.Servers = []string{"z:2181"}
	c.Locks.MaxWait = 1500 * time.Millisecond
	c.Locks.LockDelay = []string{"order:*=5s"}
	got, err := Load(writeFile(t, "c.yaml", c.String()))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, c) {
		t.Errorf("Load(String()) =\n%v\nwant\n%v", got, c)
	}
}

// TestLeaves checks the reflection tables: unique env names, parseable
// types, flags naming real keys.
func TestLeaves(t *testing.T) {
	seen := map[string]string{}
	for _, l := range leaves() {
		if prev, dup := seen[l.env]; dup {
			t.Errorf("%s and %s share %s", prev, l.path, l.env)
		}
		seen[l.env] = l.path
		if _, err := parseLeaf(l.typ, "", true); err != nil && strings.HasPrefix(err.Error(), "conf: unsupported") {
			t.Errorf("%s: %v", l.path, err)
		}
	}
	for _, want := range []string{"LOCKPROXY_LISTEN", "LOCKPROXY_REDLOCK_DRIFT_FACTOR", "LOCKPROXY_LIMITS_SHUTDOWN_TIMEOUT", "LOCKPROXY_LOCK_PATTERNS"} {
		if _, ok := seen[want]; !ok {
			t.Errorf("no leaf for %s", want)
		}
	}
	for _, f := range flagSpecs {
		if _, ok := leafByPath(f.path); !ok {
			t.Errorf("flag --%s names unknown key %s", f.name, f.path)
		}
	}
}

// FuzzLoad checks that no YAML input panics the decoder and that whatever
// decodes renders to YAML that decodes the same way.
func FuzzLoad(f *testing.F) {
	for _, s := range []string{
		"", "listen: 127.0.0.1:7380\nredlock:\n  nodes: [a:6379, b:6379, c:6379]\n",
		"locks: {default_ttl: 30s, max_ttl: 10m}\n", "redlock:\n  nodez: 1\n", "a: &x {b: 1}\nc: *x\n",
		"log:\n  <<: [{level: debug}, {format: console}]\n", "- 1\n", "limits: 5\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c := Default()
		if err := decode(data, "fuzz.yaml", &c); err != nil {
			return
		}
		c.Redlock.Password = "" // String redacts it
		out := c.String()
		c2 := Default()
		if err := decode([]byte(out), "out.yaml", &c2); err != nil {
			t.Fatalf("decode(String()) = %v\n%s", err, out)
		}
		if out2 := c2.String(); out2 != out {
			t.Fatalf("String() not stable:\n%s\nthen\n%s", out, out2)
		}
	})
}

// TestUpstream: the short form "upstream: host:port", the full mapping,
// LOCKPROXY_UPSTREAM and its _ADDRESS variant, and the checks.
func TestUpstream(t *testing.T) {
	for _, tc := range []struct {
		name, file string
		env        []string
		want       Upstream
		problem    string // in the error; "" = valid
	}{
		{"short form", "upstream: up:6379\n", nil,
			Upstream{Address: "up:6379", PoolSize: 4, DialTimeout: time.Second, ReadTimeout: 10 * time.Second, DenyCommands: DefaultDenyCommands, EventLoop: true}, ""},
		{"mapping", "upstream:\n  address: up:1\n  username: app\n  password: pw\n  pool_size: 2\n  read_timeout: 0s\n  deny_commands: [flushall]\n", nil,
			Upstream{Address: "up:1", Username: "app", Password: "pw", PoolSize: 2, DialTimeout: time.Second, DenyCommands: []string{"flushall"}, EventLoop: true}, ""},
		{"nothing denied", "upstream:\n  address: up:1\n  deny_commands: []\n", nil,
			Upstream{Address: "up:1", PoolSize: 4, DialTimeout: time.Second, ReadTimeout: 10 * time.Second, DenyCommands: []string{}, EventLoop: true}, ""},
		{"no event loop", "upstream:\n  address: up:1\n  event_loop: false\n", nil,
			Upstream{Address: "up:1", PoolSize: 4, DialTimeout: time.Second, ReadTimeout: 10 * time.Second, DenyCommands: DefaultDenyCommands}, ""},
		{"env short form", "", []string{"LOCKPROXY_UPSTREAM=env:1"},
			Upstream{Address: "env:1", PoolSize: 4, DialTimeout: time.Second, ReadTimeout: 10 * time.Second, DenyCommands: DefaultDenyCommands, EventLoop: true}, ""},
		{"env address wins", "", []string{"LOCKPROXY_UPSTREAM=env:1", "LOCKPROXY_UPSTREAM_ADDRESS=env:2", "LOCKPROXY_UPSTREAM_POOL_SIZE=8"},
			Upstream{Address: "env:2", PoolSize: 8, DialTimeout: time.Second, ReadTimeout: 10 * time.Second, DenyCommands: DefaultDenyCommands, EventLoop: true}, ""},
		{"unknown key", "upstream:\n  adress: up:1\n", nil, Upstream{}, "upstream.adress: unknown key"},
		{"bad pool", "upstream:\n  address: up:1\n  pool_size: 0\n", nil, Upstream{}, "upstream.pool_size"},
		{"bad deny entry", "upstream:\n  address: up:1\n  deny_commands: ['client kill']\n", nil, Upstream{}, "upstream.deny_commands[0]"},
		{"bad address", "upstream: nowhere\n", nil, Upstream{}, "upstream.address"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := writeFile(t, "c.yaml", "dev: true\n"+tc.file)
			c, err := FromArgs([]string{p}, tc.env)
			if err == nil {
				err = c.Validate()
			}
			if tc.problem != "" {
				if err == nil || !strings.Contains(err.Error(), tc.problem) {
					t.Fatalf("load %q = %v; want a problem with %q", tc.file, err, tc.problem)
				}
				return
			}
			if err != nil {
				t.Fatalf("load %q: %v", tc.file, err)
			}
			if !reflect.DeepEqual(c.Upstream, tc.want) {
				t.Errorf("upstream = %+v; want %+v", c.Upstream, tc.want)
			}
			if s := c.String(); tc.want.Password != "" && strings.Contains(s, tc.want.Password) {
				t.Errorf("String() shows the upstream password:\n%s", s)
			}
		})
	}
}

// TestTLSConfig: upstream.tls and redlock.tls load their files (paths in
// a file relative to it), refuse what cannot work with the key path, and
// give a client configuration that verifies against ca_file.
func TestTLSConfig(t *testing.T) {
	ca := harness.NewTestCA(t)
	client := ca.Client()
	dir := t.TempDir()
	for name, src := range map[string]string{"ca.pem": ca.CAFile, "c.pem": client.Cert, "k.pem": client.Key} {
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	file := func(body string) string {
		p := filepath.Join(dir, "c.yaml")
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, tc := range []struct {
		name, body string
		args       []string
		wantErr    string
	}{
		{"upstream, relative paths", "upstream: {address: up:6380, tls: {enabled: true, ca_file: ca.pem, cert_file: c.pem, key_file: k.pem}}", nil, ""},
		{"nodes, system roots", "redlock: {tls: {enabled: true}}", nil, ""},
		{"missing CA file", "redlock: {tls: {enabled: true, ca_file: nope.pem}}", nil, "redlock.tls.ca_file: open"},
		{"not a certificate", "redlock: {tls: {enabled: true, ca_file: c.yaml}}", nil, "redlock.tls.ca_file: no PEM certificate"},
		{"cert without key", "upstream: {address: up:6380, tls: {enabled: true, cert_file: c.pem}}", nil, "upstream.tls.key_file: is required with upstream.tls.cert_file"},
		{"files while off", "redlock: {tls: {ca_file: ca.pem}}", nil, "redlock.tls.enabled: is false while other redlock.tls keys are set"},
		{"dev nodes", "redlock: {tls: {enabled: true}}", []string{"--dev"}, "redlock.tls.enabled: the --dev nodes speak no TLS"},
		{"listener, mutual", "tls: {enabled: true, cert_file: c.pem, key_file: k.pem, client_ca_file: ca.pem}", nil, ""},
		{"listener without a key", "tls: {enabled: true, cert_file: c.pem}", nil, "tls.key_file: is required"},
		{"listener without a certificate", "tls: {enabled: true, key_file: k.pem}", nil, "tls.cert_file: is required"},
		{"listener key not a key", "tls: {enabled: true, cert_file: c.pem, key_file: ca.pem}", nil, "tls.key_file: "},
		{"listener certificate not a certificate", "tls: {enabled: true, cert_file: k.pem, key_file: k.pem}", nil, "tls.cert_file: no PEM certificate"},
		{"listener missing client CA", "tls: {enabled: true, cert_file: c.pem, key_file: k.pem, client_ca_file: nope.pem}", nil, "tls.client_ca_file: open"},
		{"listener files while off", "tls: {cert_file: c.pem}", nil, "tls.enabled: is false while other tls keys are set"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := tc.args
			if args == nil {
				args = []string{"--nodes", "n1:6380"}
			}
			c, err := FromArgs(append(args, file(tc.body)), nil)
			if err == nil {
				err = c.Validate()
			}
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("FromArgs = %v; want an error containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("FromArgs = %v", err)
			}
			if scfg, err := c.TLS.ServerConfig(); err != nil || c.TLS.Enabled != (scfg != nil) ||
				(c.TLS.ClientCAFile != "" && scfg.ClientAuth != tls.RequireAndVerifyClientCert) {
				t.Fatalf("ServerConfig(%+v) = %v, %v", c.TLS, scfg, err)
			}
			for _, tt := range []TLS{c.Upstream.TLS, c.Redlock.TLS} {
				cfg, err := tt.ClientConfig()
				if err != nil || (tt.Enabled != (cfg != nil)) {
					t.Fatalf("ClientConfig(%+v) = %v, %v", tt, cfg, err)
				}
				// ca_file's CAs are checked by VerifyConnection, which reads
				// the reloaded ones (TestServerVerifier).
				if cfg != nil && tt.CAFile != "" && (cfg.VerifyConnection == nil || cfg.GetClientCertificate == nil || cfg.MinVersion < tls.VersionTLS12) {
					t.Fatalf("ClientConfig(%+v): verifier %v, client certificate %v, min version %x", tt, cfg.VerifyConnection != nil, cfg.GetClientCertificate != nil, cfg.MinVersion)
				}
			}
		})
	}
}

// TestCertReloader: Reload serves the certificate now in the files; a
// failed reload keeps the one in use.
func TestCertReloader(t *testing.T) {
	ca := harness.NewTestCA(t)
	first, second := ca.Server(), ca.Server()
	dir := t.TempDir()
	cert, key := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	serial := func(r *CertReloader) string {
		c, _ := r.certificate(nil)
		x, err := x509.ParseCertificate(c.Certificate[0])
		if err != nil {
			t.Fatal(err)
		}
		return x.SerialNumber.String()
	}
	first.Install(t, cert, key)
	r, err := NewCertReloader(cert, key)
	if err != nil {
		t.Fatal(err)
	}
	s1 := serial(r)
	if c, _ := r.certificate(nil); c.Leaf != nil && !r.NotAfter().Equal(c.Leaf.NotAfter) || r.NotAfter().Before(time.Now()) {
		t.Fatalf("NotAfter = %v; want the certificate's", r.NotAfter())
	}
	second.Install(t, cert, key)
	if err := r.Reload(); err != nil {
		t.Fatal(err)
	}
	s2 := serial(r)
	if s1 == s2 {
		t.Fatalf("serial %s after the reload; want the new certificate's", s2)
	}
	if err := os.WriteFile(key, []byte("not a key"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := r.Reload(); err == nil || serial(r) != s2 {
		t.Fatalf("a reload of a broken key = %v, serial %s; want an error and %s kept", err, serial(r), s2)
	}
	if rs := Reloaders(); !slices.Contains(rs, r) {
		t.Fatal("the reloader is not listed")
	}
}

// TestParsePermission: auth.permissions entries in Redis's ACL words,
// their rules kept in order, and the words that are not taken.
func TestParsePermission(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    Permission
		wantErr string
	}{
		{in: "app ~app:* ~shared +@lock +GET", want: Permission{User: "app",
			Keys: []string{"app:*", "shared"}, LimitKeys: true, Commands: []string{"+@lock", "+get"}}},
		{in: "ops +@all -@dangerous +config|get -client|kill", want: Permission{User: "ops",
			Commands: []string{"+@all", "-@dangerous", "+config|get", "-client|kill"}}},
		{in: "ro allkeys allcommands -@write", want: Permission{User: "ro",
			Keys: []string{"*"}, LimitKeys: true, Commands: []string{"+@all", "-@write"}}},
		{in: "k ~a resetkeys ~b +get", want: Permission{User: "k",
			Keys: []string{"b"}, LimitKeys: true, Commands: []string{"+get"}}},
		{in: "k resetkeys +get", want: Permission{User: "k", LimitKeys: true, Commands: []string{"+get"}}},
		{in: "sub &news.* &alerts +subscribe +publish", want: Permission{User: "sub",
			Channels: []string{"news.*", "alerts"}, LimitChannels: true, Commands: []string{"+subscribe", "+publish"}}},
		{in: "sub resetchannels +@all", want: Permission{User: "sub", LimitChannels: true, Commands: []string{"+@all"}}},
		{in: "sub &x allchannels +@all", want: Permission{User: "sub",
			Channels: []string{"*"}, LimitChannels: true, Commands: []string{"+@all"}}},
		{in: "n nocommands +get", want: Permission{User: "n", Commands: []string{"-@all", "+get"}}},
		{in: "app", wantErr: `want "user ~glob… +command…", with at least one rule`},
		{in: "app -@all", wantErr: "no +command rule: the user could run nothing (+@all for every command)"},
		{in: "app ~x", wantErr: "no +command rule: the user could run nothing (+@all for every command)"},
		{in: "app +@nosuch", wantErr: `unknown category "@nosuch": lockproxy knows @all, @lock and Redis's ACL categories (@read, @write, @keyspace, @dangerous, …)`},
		{in: "app +config|", wantErr: `rule "+config|": want +command|subcommand`},
		{in: "app +|get", wantErr: `rule "+|get": want +command|subcommand`},
		{in: "app +a|b|c", wantErr: `rule "+a|b|c": want +command|subcommand`},
		{in: "app +@all -get|secret", wantErr: `rule "-get|secret": get has no subcommands, and a first argument cannot be taken away (use -get, or ~ key patterns)`},
		{in: "app +select|0", want: Permission{User: "app", Commands: []string{"+select|0"}}}, // Redis 6's first-argument rule
		{in: "app +@all -CONFIG|SET", want: Permission{User: "app", Commands: []string{"+@all", "-config|set"}}},
		{in: "app ~[ +get", wantErr: `invalid key glob "[": syntax error in pattern`},
		{in: "app &[ +get", wantErr: `invalid channel glob "[": syntax error in pattern`},
		{in: "app %R~x +get", wantErr: `rule "%R~x": read- and write-only key patterns are not supported; ~glob allows both`},
		{in: "app (~x +get) +get", wantErr: `rule "(~x": selectors are not supported`},
		{in: "app >s3cret +get", wantErr: "password and user-state rules (>…, #…, nopass, on, off, reset…) are not taken here: passwords come from auth.users and auth.password"},
		{in: "app on +get", wantErr: "password and user-state rules (>…, #…, nopass, on, off, reset…) are not taken here: passwords come from auth.users and auth.password"},
		{in: "app get", wantErr: `rule "get": want ~glob, &glob, +command, -command or +@category`},
	} {
		got, err := ParsePermission(tc.in)
		if tc.wantErr != "" {
			if err == nil || err.Error() != tc.wantErr {
				t.Errorf("%q: err %v; want %q", tc.in, err, tc.wantErr)
			}
			if err != nil && strings.Contains(err.Error(), "s3cret") {
				t.Errorf("%q: the error repeats a password", tc.in)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%q = %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
	}
}
