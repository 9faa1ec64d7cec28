package e2e

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockproxy/lockproxy/test/harness"
	"github.com/lockproxy/lockproxy/test/lockclient"
)

// TestPipelineWrittenBeforeRead: a go-redis pipeline whose commands and
// replies are both bigger than the sockets' buffers (go-redis writes the
// whole pipeline, then reads) is answered through lockproxy as it is by
// redis-server, which keeps reading and buffers the replies. lockproxy
// used to stop reading while a batch's replies waited for the client, the
// client waited for lockproxy to read the rest of its pipeline, and after
// 30 s (the reply write timeout) lockproxy reset the connection: every
// reply was lost. On goroutines (no upstream) and on the event loop (with
// one), for commands lockproxy answers (ECHO) and relayed ones (SET … GET,
// whose replies the upstream connection's reader writes), and over TLS
// (tls.enabled), whose replies lockproxy wrote blocking until the write
// timeout reset the connection.
func TestPipelineWrittenBeforeRead(t *testing.T) {
	cl := startCluster(t, 3)
	up := harness.StartRedis(t, harness.RedisOptions{})
	const (
		cmds = 4000
		size = 8 << 10 // 32 MB each way
	)
	value := strings.Repeat("v", size)
	echo := func(ctx context.Context, p redis.Pipeliner) *redis.Cmd { return p.Do(ctx, "ECHO", value) }
	setGet := func(ctx context.Context, p redis.Pipeliner) *redis.Cmd {
		return p.Do(ctx, "SET", "pipelined", value, "GET")
	}
	goroutines := startInstance(t, cl.addrs()).addr
	loop := startInstance(t, cl.addrs(), "--upstream", up.Addr).addr
	ca := harness.NewTestCA(t)
	overTLS := startInstanceEnv(t, cl.addrs(), append(tlsEnv(ca), "LOCKPROXY_UPSTREAM_ADDRESS="+up.Addr)).addr
	for _, tc := range []struct {
		name, addr string
		cmd        func(context.Context, redis.Pipeliner) *redis.Cmd
		set        bool // the key SET … GET reads is set first
		tls        *tls.Config
	}{
		{"redis-server", up.Addr, echo, false, nil},
		{"lockproxy on goroutines", goroutines, echo, false, nil},
		{"lockproxy on the event loop", loop, echo, false, nil},
		{"lockproxy on the event loop, relayed", loop, setGet, true, nil},
		{"lockproxy over TLS", overTLS, echo, false, ca.ClientConfig()},
		{"lockproxy over TLS, relayed", overTLS, setGet, true, ca.ClientConfig()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Bounded: a stalled connection fails the test in seconds,
			// not at lockproxy's 30 s write timeout.
			c := redis.NewClient(&redis.Options{
				Addr: tc.addr, Protocol: 2, MaxRetries: -1, DisableIdentity: true, TLSConfig: tc.tls,
				ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second,
				ContextTimeoutEnabled: true, PoolSize: 1,
			})
			defer c.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if tc.set {
				if err := c.Set(ctx, "pipelined", value, 0).Err(); err != nil {
					t.Fatalf("SET: %v", err)
				}
			}
			start := time.Now()
			pipe := c.Pipeline()
			res := make([]*redis.Cmd, cmds)
			for i := range res {
				res[i] = tc.cmd(ctx, pipe)
			}
			if _, err := pipe.Exec(ctx); err != nil {
				t.Fatalf("pipeline of %d commands of %d bytes: %v after %v; want every reply", cmds, size, err, time.Since(start).Round(time.Millisecond))
			}
			for i, r := range res {
				if v, err := r.Text(); err != nil || v != value {
					t.Fatalf("command %d of the pipeline = %d bytes, %v; want the %d bytes sent", i, len(v), err, size)
				}
			}
			t.Logf("%s: %d replies in %v", tc.name, cmds, time.Since(start).Round(time.Millisecond))
		})
	}
}

// TestOutputLimit: a client whose unread replies go past
// limits.max_output_bytes is closed, and lockproxy logs why, as Redis
// does past client-output-buffer-limit; over TLS too.
func TestOutputLimit(t *testing.T) {
	cl := startCluster(t, 3)
	ca := harness.NewTestCA(t)
	for _, tc := range []struct {
		name string
		env  []string
		tls  *tls.Config
	}{
		{"plain", nil, nil},
		{"TLS", tlsEnv(ca), ca.ClientConfig()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := startInstanceEnv(t, cl.addrs(), append(tc.env, "LOCKPROXY_LIMITS_MAX_OUTPUT_BYTES=1048576"))
			raw, err := net.Dial("tcp", in.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer raw.Close()
			// Small socket buffers: the replies the sockets hold do not count.
			_ = raw.(*net.TCPConn).SetReadBuffer(64 << 10)
			c := raw
			if tc.tls != nil {
				cfg := tc.tls.Clone()
				cfg.ServerName = "127.0.0.1"
				c = tls.Client(raw, cfg)
			}
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
			cmd := "*2\r\n$4\r\nECHO\r\n$8192\r\n" + strings.Repeat("v", 8192) + "\r\n"
			// 16 MB of replies, not read. The write fails once lockproxy closed.
			_, _ = c.Write([]byte(strings.Repeat(cmd, 2048)))
			deadline := time.Now().Add(10 * time.Second)
			for !strings.Contains(in.proc.Output(), "output buffer limit") {
				if time.Now().After(deadline) {
					t.Fatalf("no log line on the output limit; output:\n%s", in.proc.Output())
				}
				time.Sleep(20 * time.Millisecond)
			}
			// Closed: reading what the sockets held ends in an error, not a
			// timeout.
			buf := make([]byte, 64<<10)
			for {
				if _, err = c.Read(buf); err != nil {
					break
				}
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				t.Fatalf("connection still open after the output limit: %v", err)
			}
		})
	}
}

// tlsEnv is lockproxy's environment for TLS with a server certificate of
// ca's.
func tlsEnv(ca *harness.TestCA) []string {
	files := ca.Server()
	return []string{"LOCKPROXY_TLS_ENABLED=true", "LOCKPROXY_TLS_CERT_FILE=" + files.Cert, "LOCKPROXY_TLS_KEY_FILE=" + files.Key}
}

// TestPubSubOutputLimit: a subscriber that stops reading is closed once
// the messages waiting for it pass limits.max_output_bytes_pubsub, as
// Redis closes a pub/sub client past its 32 MB limit, rather than kept
// until limits.max_output_bytes (1 GB) or the write timeout: messages
// come at the publishers' pace, not the subscriber's.
func TestPubSubOutputLimit(t *testing.T) {
	cl := startCluster(t, 3)
	up := harness.StartRedis(t, harness.RedisOptions{})
	in := startInstanceEnv(t, cl.addrs(), []string{"LOCKPROXY_UPSTREAM_ADDRESS=" + up.Addr,
		"LOCKPROXY_LIMITS_MAX_OUTPUT_BYTES_PUBSUB=1048576"})
	sub, err := net.Dial("tcp", in.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	_ = sub.(*net.TCPConn).SetReadBuffer(64 << 10)
	_ = sub.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := sub.Write([]byte("SUBSCRIBE big\r\n")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4096)
	if n, err := sub.Read(buf); err != nil || !strings.Contains(string(buf[:n]), "subscribe") {
		t.Fatalf("SUBSCRIBE = %q, %v", buf[:n], err)
	}
	// 16 MB of messages through the upstream, which the subscriber does
	// not read.
	pub := up.Client(t)
	ctx := lockclient.CtxFor(t, 20*time.Second)
	msg := strings.Repeat("m", 8192)
	deadline := time.Now().Add(15 * time.Second)
	for i := 0; i < 2048 && !strings.Contains(in.proc.Output(), "output buffer limit"); i++ {
		if err := pub.Publish(ctx, "big", msg).Err(); err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			break
		}
	}
	for !strings.Contains(in.proc.Output(), "output buffer limit") {
		if time.Now().After(deadline) {
			t.Fatalf("no log line on the output limit after 16 MB of messages to a subscriber that does not read; output:\n%s", in.proc.Output())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if out := in.proc.Output(); !strings.Contains(out, `"pubsub":true`) {
		t.Errorf("the limit's log line does not say the client was a subscriber; output:\n%s", out)
	}
	// Closed: reading what the sockets held ends in an error, not a
	// timeout.
	_ = sub.SetReadDeadline(time.Now().Add(5 * time.Second))
	for {
		if _, err = sub.Read(buf); err != nil {
			break
		}
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("subscriber still connected after its output limit: %v", err)
	}
}
