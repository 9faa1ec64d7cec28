package commands

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/relay"
	"github.com/lockproxy/lockproxy/resp"
	"github.com/lockproxy/lockproxy/test/harness"
)

// proxyWithUpstream serves a Handler relaying to a real redis-server (on
// the event loop, with CLIENT LIST seeing every session), and returns its
// address and the upstream's, so that a test can send the same bytes to
// both and compare what comes back.
func proxyWithUpstream(t *testing.T, o Options) (proxy, upstream string) {
	t.Helper()
	proxy, up := proxyWithRedis(t, o)
	return proxy, up.Addr
}

// proxyWithRedis is proxyWithUpstream returning the upstream itself, for
// tests that pause or stop it.
func proxyWithRedis(t *testing.T, o Options) (proxy string, upstream *harness.Redis) {
	t.Helper()
	up := harness.StartRedis(t, harness.RedisOptions{})
	r := relay.New(relay.Config{Addr: up.Addr, PoolSize: 4, DialTimeout: time.Second, ReadTimeout: 5 * time.Second})
	o.Relay = r
	if o.Backend == nil {
		o.Backend = &fakeBackend{}
	}
	o.Limits = testLimits
	srv := &resp.Server{EventLoop: true, AuthRequired: o.Password != ""}
	o.Clients = srv.Sessions
	h := NewHandler(o)
	srv.Handler = h
	return serveRelayed(t, srv, h, r), up
}

// serveRelayed serves h (srv's handler, relaying with rl) on a loopback
// port for the test's life, and returns the address; the cleanup shuts
// the server down before it closes the handler and the relay.
func serveRelayed(t *testing.T, srv *resp.Server, h *Handler, rl *relay.Relay) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		<-done
		h.Close()
		rl.Close()
	})
	return ln.Addr().String()
}

// rawConn is a client connection that sends inline commands and reads
// replies byte for byte, with nothing in between to reorder or decode them.
type rawConn struct {
	c  net.Conn
	rd *bufio.Reader
}

func dialRaw(t *testing.T, addr string) *rawConn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	return &rawConn{c: c, rd: bufio.NewReader(c)}
}

// do sends an inline command and returns its reply: a bulk string's
// content, or the line (with its type byte) of any other reply, a RESP2
// null ("$-1") too.
func (r *rawConn) do(t *testing.T, cmd string) string {
	t.Helper()
	if _, err := fmt.Fprintf(r.c, "%s\r\n", cmd); err != nil {
		t.Fatal(err)
	}
	return r.reply(t)
}

// reply reads one reply as do returns it.
func (r *rawConn) reply(t *testing.T) string {
	t.Helper()
	line, err := r.rd.ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	line = strings.TrimSuffix(line, "\r\n")
	if line[0] != '$' || line == "$-1" {
		return line
	}
	n, _ := strconv.Atoi(line[1:])
	b := make([]byte, n+2)
	if _, err := io.ReadFull(r.rd, b); err != nil {
		t.Fatal(err)
	}
	return string(b[:n])
}

// subscribedExchange subscribes to ch on addr (after hello, if any, whose
// reply it reads), then sends then in one write and returns what comes
// back within half a second, "<EOF>" marking a connection the server
// closed.
func subscribedExchange(t *testing.T, addr, hello, then string) string {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	rd := bufio.NewReader(c)
	if hello != "" {
		if _, err := c.Write([]byte(hello)); err != nil {
			t.Fatal(err)
		}
		// The HELLO map: 7 pairs, the last an empty array.
		for {
			line, err := rd.ReadString('\n')
			if err != nil {
				t.Fatal(err)
			}
			if line == "*0\r\n" {
				break
			}
		}
	}
	if _, err := c.Write([]byte("SUBSCRIBE ch\r\n")); err != nil {
		t.Fatal(err)
	}
	// The confirmation: a 3-element frame ending with ":1".
	for {
		line, err := rd.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(line, ":1") {
			break
		}
	}
	if _, err := c.Write([]byte(then)); err != nil {
		t.Fatal(err)
	}
	var out []byte
	buf := make([]byte, 4096)
	_ = c.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
	for {
		n, err := rd.Read(buf)
		out = append(out, buf[:n]...)
		if err != nil {
			if strings.Contains(err.Error(), "EOF") {
				out = append(out, "<EOF>"...)
			}
			return string(out)
		}
	}
}
