package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/lockproxy/lockproxy/test/harness"
	"github.com/lockproxy/lockproxy/test/lockclient"
)

// TestCAReload: on SIGHUP lockproxy reads its CA files again, as it does
// its certificates, and new handshakes check against the new CAs while
// open connections go on.
//   - The listener's client_ca_file: a client certificate from a second CA
//     is refused; a file with no certificate in it, then SIGHUP, changes
//     nothing (and is logged); with the file rewritten to the second CA
//     and SIGHUP, that client is accepted, a new client of the first CA
//     refused, and a connection of the first CA made before goes on.
//   - redlock.tls.ca_file: TLS-only nodes switched at run time to a
//     certificate from a second CA (CONFIG SET), their connections killed:
//     LOCK gets NOQUORUM naming the unknown authority; with ca_file
//     rewritten to the second CA and SIGHUP, LOCK is granted again.
func TestCAReload(t *testing.T) {
	t.Parallel()
	t.Run("client_ca_file", func(t *testing.T) {
		t.Parallel()
		testClientCAReload(t)
	})
	t.Run("redlock.tls.ca_file", func(t *testing.T) {
		t.Parallel()
		testNodeCAReload(t)
	})
}

// copyCAs writes the CA certificates of files, concatenated, to dst.
func copyCAs(t *testing.T, dst string, files ...string) {
	t.Helper()
	var b []byte
	for _, f := range files {
		pem, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		b = append(b, pem...)
	}
	if err := os.WriteFile(dst, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

func hup(t *testing.T, in *instance) {
	t.Helper()
	if err := in.proc.Signal(syscall.SIGHUP); err != nil {
		t.Fatalf("SIGHUP: %v", err)
	}
}

// waitLog waits (up to 10 s) until lockproxy's output has want n times.
func waitLog(t *testing.T, in *instance, want string, n int) {
	t.Helper()
	if err := eventually(200, 50*time.Millisecond, func() error {
		if got := strings.Count(in.proc.Output(), want); got < n {
			return fmt.Errorf("%q logged %d times; want %d", want, got, n)
		}
		return nil
	}); err != nil {
		t.Fatalf("%v; output:\n%s", err, in.proc.Output())
	}
}

func testClientCAReload(t *testing.T) {
	cl := startCluster(t, 1)
	ca1, ca2 := harness.NewTestCA(t), harness.NewTestCA(t)
	srv := ca1.Server()
	clientCAs := filepath.Join(t.TempDir(), "clients.pem")
	copyCAs(t, clientCAs, ca1.CAFile)
	in := startInstanceEnv(t, cl.addrs(), []string{"LOCKPROXY_TLS_ENABLED=true",
		"LOCKPROXY_TLS_CERT_FILE=" + srv.Cert, "LOCKPROXY_TLS_KEY_FILE=" + srv.Key,
		"LOCKPROXY_TLS_CLIENT_CA_FILE=" + clientCAs})

	roots := ca1.ClientConfig().RootCAs // lockproxy's own certificate stays CA1's
	client := func(ca *harness.TestCA) *redis.Client {
		cfg := ca.ClientConfig()
		cfg.RootCAs = roots
		c := redis.NewClient(&redis.Options{Addr: in.addr, TLSConfig: cfg, Protocol: 2, MaxRetries: -1,
			DisableIdentity: true, DialTimeout: 5 * time.Second, PoolSize: 1,
			MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}})
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	// ping is a PING on a new connection of a client of ca.
	ping := func(ca *harness.TestCA) error {
		c := client(ca)
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return c.Ping(ctx).Err()
	}
	if err := ping(ca1); err != nil {
		t.Fatalf("a client of client_ca_file's CA: %v", err)
	}
	if err := ping(ca2); err == nil {
		t.Fatal("a client of another CA was accepted")
	}
	old := client(ca1)
	ctx := lockclient.CtxFor(t, 30*time.Second)
	if err := old.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}

	// A file with no certificate: the CAs in use stay, and the log says so.
	if err := os.WriteFile(clientCAs, []byte("rotating\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	hup(t, in)
	waitLog(t, in, "CA file not reloaded", 1)
	if err := ping(ca1); err != nil {
		t.Fatalf("a client of the CA in use, after a failed reload: %v", err)
	}

	copyCAs(t, clientCAs, ca2.CAFile)
	hup(t, in)
	waitLog(t, in, "SIGHUP: CA file reloaded", 1)
	if err := eventually(100, 50*time.Millisecond, func() error { return ping(ca2) }); err != nil {
		t.Fatalf("a client of the new CA, after SIGHUP: %v\noutput:\n%s", err, in.proc.Output())
	}
	if err := ping(ca1); err == nil {
		t.Fatal("a new client of the CA no longer in client_ca_file was accepted")
	}
	if err := old.Ping(ctx).Err(); err != nil {
		t.Fatalf("the connection made before the reload: %v", err)
	}
}

func testNodeCAReload(t *testing.T) {
	ca1, ca2 := harness.NewTestCA(t), harness.NewTestCA(t)
	nodes := harness.StartRedisN(t, 3, harness.RedisOptions{TLS: ca1})
	caFile := filepath.Join(t.TempDir(), "nodes-ca.pem")
	copyCAs(t, caFile, ca1.CAFile)
	in := startInstanceEnv(t, harness.Addrs(nodes), []string{
		"LOCKPROXY_REDLOCK_TLS_ENABLED=true", "LOCKPROXY_REDLOCK_TLS_CA_FILE=" + caFile})
	rc := lc.DialRaw(t, in.addr)
	lock := func() lockclient.Reply {
		return rc.Do("LOCK", "careload-"+lockclient.RandID(), "PX", "5000")
	}
	granted := func(r lockclient.Reply) bool { return r.Kind == '*' || r.Kind == '%' }
	// Until lockproxy's first connections are up (TLS handshakes on a
	// loaded machine), a LOCK may find nodes timing out.
	var last lockclient.Reply
	if err := eventually(100, 100*time.Millisecond, func() error {
		if last = lock(); !granted(last) {
			return fmt.Errorf("LOCK = %v", last)
		}
		return nil
	}); err != nil {
		t.Fatalf("%v; want a grant with nodes of ca_file's CA", err)
	}

	// The test's own connections to the nodes trust both CAs and show no
	// client certificate, so that they work before and after the switch.
	both := x509.NewCertPool()
	for _, f := range []string{ca1.CAFile, ca2.CAFile} {
		pem, err := os.ReadFile(f)
		if err != nil || !both.AppendCertsFromPEM(pem) {
			t.Fatalf("CA file %s: %v", f, err)
		}
	}
	ctx := lockclient.CtxFor(t, 30*time.Second)
	for _, nd := range nodes {
		c := redis.NewClient(&redis.Options{Addr: nd.Addr, Protocol: 2, DisableIdentity: true, MaxRetries: -1,
			TLSConfig:                &tls.Config{RootCAs: both, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12},
			MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}})
		defer c.Close()
		f := ca2.Server()
		// The three together: Redis loads the new TLS context as one.
		if err := c.Do(ctx, "CONFIG", "SET", "tls-cert-file", f.Cert, "tls-key-file", f.Key, "tls-ca-cert-file", f.CA).Err(); err != nil {
			t.Fatalf("CONFIG SET on %s: %v", nd.Addr, err)
		}
		// lockproxy's connections (not this one) must be made again.
		if err := c.Do(ctx, "CLIENT", "KILL", "TYPE", "normal").Err(); err != nil {
			t.Fatalf("CLIENT KILL on %s: %v", nd.Addr, err)
		}
	}

	// The first LOCKs may meet connections lockproxy has not yet seen
	// closed; every later one redials, and is refused in the handshake.
	if err := eventually(50, 100*time.Millisecond, func() error {
		last = lock()
		if granted(last) {
			t.Fatalf("LOCK granted by nodes whose CA lockproxy does not trust: %v", last)
		}
		if last.Kind == '-' && strings.HasPrefix(last.Str, "NOQUORUM") && strings.Contains(last.Str, "unknown authority") {
			return nil
		}
		return fmt.Errorf("LOCK = %v", last)
	}); err != nil {
		t.Fatalf("%v; want NOQUORUM naming the unknown authority", err)
	}

	copyCAs(t, caFile, ca2.CAFile)
	hup(t, in)
	waitLog(t, in, "SIGHUP: CA file reloaded", 1)
	if err := eventually(100, 100*time.Millisecond, func() error {
		if last = lock(); !granted(last) {
			return fmt.Errorf("LOCK = %v", last)
		}
		return nil
	}); err != nil {
		t.Fatalf("%v; want a grant once ca_file holds the nodes' new CA\noutput:\n%s", err, in.proc.Output())
	}
}
