package postgres

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/test/harness"
	"github.com/lockproxy/lockproxy/test/lockclient"
)

// shared is the PostgreSQL server the tests share; each test has tables of
// its own (a table prefix). Tests that kill a server start their own.
var shared *harness.Postgres

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "lockproxy-pg-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	shared, err = harness.LaunchPostgres(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	shared.Kill()
	os.RemoveAll(dir)
	os.Exit(code)
}

// Lock settings the tests check against (lockproxy's defaults).
const (
	driftFactor = 0.01
	driftMinMS  = 2
)

// lc is the lock-client helpers with generous waits: a loaded machine.
var lc = lockclient.Config{
	AcquireTimeout: 60 * time.Second, CommandTimeout: 30 * time.Second,
	DialTimeout: 5 * time.Second, ReplyTimeout: 60 * time.Second,
	ClientRead: 90 * time.Second, ClientWrite: 5 * time.Second, PoolSize: 4,
}

// instance is one running lockproxy on the PostgreSQL backend.
type instance struct {
	addr  string
	admin string // the admin listener (/metrics)
	proc  *harness.Proc
	// dsn, prefix and env are what it was started with, for start.
	dsn, prefix string
	env         []string
}

// startInstance starts lockproxy with --backend postgres on dsn, its tables
// named with prefix, and waits until it listens. env adds LOCKPROXY_*
// settings.
func startInstance(t testing.TB, dsn, prefix string, env ...string) *instance {
	t.Helper()
	in := &instance{addr: fmt.Sprintf("127.0.0.1:%d", harness.FreePort(t)), admin: fmt.Sprintf("127.0.0.1:%d", harness.FreePort(t)),
		dsn: dsn, prefix: prefix, env: env}
	in.start(t)
	return in
}

// start starts a lockproxy process of in, on its addresses (again, after
// its process was killed), and waits until it listens.
func (in *instance) start(t testing.TB) {
	t.Helper()
	bin := harness.BuildLockproxy(t)
	cmd := exec.Command(bin, "--listen", in.addr, "--admin", in.admin, "--backend", "postgres", "--postgres-dsn", in.dsn)
	cmd.Env = append(os.Environ(), "LOCKPROXY_POSTGRES_TABLE_PREFIX="+in.prefix)
	cmd.Env = append(cmd.Env, in.env...)
	proc := harness.StartCmd(t, cmd)
	in.proc = proc
	t.Cleanup(func() {
		// A binary built with -race (make test-race) reports here.
		if out := proc.Output(); strings.Contains(out, "WARNING: DATA RACE") {
			t.Errorf("lockproxy reported a data race:\n%s", out)
		}
	})
	for _, a := range []string{in.addr, in.admin} {
		if err := harness.WaitTCP(a, 60*time.Second); err != nil {
			t.Fatalf("lockproxy did not listen on %s: %v\noutput:\n%s", a, err, proc.Output())
		}
	}
}

// metric reads one sample of in's /metrics, -1 when absent.
func metric(t *testing.T, in *instance, sample string) float64 {
	t.Helper()
	hc := &http.Client{Timeout: 30 * time.Second}
	resp, err := hc.Get("http://" + in.admin + "/metrics")
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, sample+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("/metrics: %s: %v", line, err)
			}
			return f
		}
	}
	return -1
}

// newPrefix is a table prefix of t's own.
func newPrefix() string {
	return "t" + strings.ToLower(lockclient.RandID())[:10] + "_"
}

// countRows counts the rows of the table <prefix><table> on pg.
func countRows(t *testing.T, pg *harness.Postgres, prefix, table string) int64 {
	t.Helper()
	c := pg.Conn(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var n int64
	if err := c.QueryRow(ctx, "SELECT count(*) FROM "+prefix+table).Scan(&n); err != nil {
		t.Fatalf("count %s%s: %v", prefix, table, err)
	}
	return n
}

// waitForRow waits up to 30 s for a live row of key in table on the
// shared server.
func waitForRow(t *testing.T, table, key string) {
	t.Helper()
	c := shared.Conn(t)
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		var n int64
		err := c.QueryRow(ctx, "SELECT count(*) FROM "+table+" WHERE key = $1 AND expires_at > clock_timestamp()", key).Scan(&n)
		cancel()
		if err != nil {
			t.Fatalf("rows of %s in %s: %v", key, table, err)
		}
		if n > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no live row of %s in %s after 30 s", key, table)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
