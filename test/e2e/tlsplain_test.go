package e2e

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/test/harness"
	"github.com/lockproxy/lockproxy/test/lockclient"
)

// startTLSToPlain starts lockproxy with redlock.tls and upstream.tls on,
// in front of nodes and an upstream that speak plain text (a
// misconfiguration: the TLS port was not the one given).
func startTLSToPlain(t *testing.T) *instance {
	t.Helper()
	ca := harness.NewTestCA(t)
	nodes := harness.StartRedisN(t, 3, harness.RedisOptions{})
	up := harness.StartRedis(t, harness.RedisOptions{})
	return startInstanceEnv(t, harness.Addrs(nodes), []string{
		"LOCKPROXY_REDLOCK_TLS_ENABLED=true", "LOCKPROXY_REDLOCK_TLS_CA_FILE=" + ca.CAFile,
		"LOCKPROXY_UPSTREAM_ADDRESS=" + up.Addr, "LOCKPROXY_UPSTREAM_TLS_ENABLED=true",
		"LOCKPROXY_UPSTREAM_TLS_CA_FILE=" + ca.CAFile, "LOCKPROXY_UPSTREAM_DIAL_TIMEOUT=1s",
	})
}

// tlsToPlainReasons are what a TLS client meeting a plain-text Redis
// reads: usually no reply at all (Redis waits for the end of a command
// line), or, when the ClientHello happens to hold a newline, Redis's
// error reply, which is no TLS record.
var tlsToPlainReasons = []string{"tls handshake: no reply (is TLS enabled on this port?)", "tls: the node does not speak TLS", "first record does not look like a TLS handshake"}

func saysTLSToPlain(s string) bool {
	for _, r := range tlsToPlainReasons {
		if strings.Contains(s, r) {
			return true
		}
	}
	return false
}

// TestTLSToPlainServer: with TLS on towards a node or upstream that
// speaks plain text (it never answers the ClientHello), a client gets its
// error within the configured timeout, and the error says the TLS
// handshake got no reply rather than only "timeout", which reads like a
// slow or dead server and hides the misconfiguration. A relayed command
// costs at most one upstream.dial_timeout, not one per dial lockproxy
// makes for it (the key table's, then the client's connection's).
func TestTLSToPlainServer(t *testing.T) {
	t.Parallel()
	in := startTLSToPlain(t)
	t.Run("node", func(t *testing.T) {
		rc := lc.DialRaw(t, in.addr)
		for i := range 2 {
			r := rc.Do("LOCK", "tlsplain-"+lockclient.RandID(), "PX", "5000")
			if r.Kind != '-' || !strings.HasPrefix(r.Str, "NOQUORUM") || !saysTLSToPlain(r.Str) {
				t.Errorf("LOCK #%d = %v; want NOQUORUM saying the nodes' TLS handshake got no reply", i, r)
			}
		}
	})
	t.Run("upstream", func(t *testing.T) {
		rc := lc.DialRaw(t, in.addr)
		for i := range 3 {
			start := time.Now()
			r := rc.Do("GET", "k")
			took := time.Since(start)
			if r.Kind != '-' || !strings.Contains(r.Str, "upstream unavailable") || !saysTLSToPlain(r.Str) {
				t.Fatalf("GET #%d = %v; want upstream unavailable, saying the TLS handshake got no reply", i, r)
			}
			// One dial (TCP and TLS handshake) is bounded by dial_timeout, 1s.
			if took > 1500*time.Millisecond {
				t.Errorf("GET #%d answered %v after %v; want within about upstream.dial_timeout (1s)", i, r, took)
			}
			// Some GETs come after the backoff and dial again, others
			// within it and fail at once: neither may cost more.
			time.Sleep(100 * time.Millisecond)
		}
	})
}

// TestLogsStayJSON: with log.format json (the default), every line
// lockproxy writes is a JSON object, also while nodes cannot be reached
// and go-redis, under the node clients, logs its failed dials.
func TestLogsStayJSON(t *testing.T) {
	t.Parallel()
	in := startTLSToPlain(t)
	time.Sleep(3 * time.Second)
	for _, line := range strings.Split(strings.TrimSpace(in.proc.Output()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Errorf("a log line is not JSON: %q", line)
			return
		}
	}
}
