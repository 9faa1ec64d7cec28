package commands

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/quorum"
	"github.com/lockproxy/lockproxy/relay"
	"github.com/lockproxy/lockproxy/resp"
)

// noQuorumBackend answers every Lock with -NOQUORUM.
type noQuorumBackend struct{ fakeBackend }

func (b *noQuorumBackend) Lock(ctx context.Context, req backends.LockRequest) (backends.Lease, error) {
	return backends.Lease{}, &quorum.NoQuorumError{OK: 1, Total: 3}
}

// dialHandlerMetrics is dialHandler with the handler's metrics in reg.
func dialHandlerMetrics(t *testing.T, b backends.Backend, reg *prometheus.Registry) net.Conn {
	t.Helper()
	_, conn := serveHandler(t, b, reg)
	return conn
}

// readFrames reads n whole RESP frames from conn and returns them.
func readFrames(t *testing.T, conn net.Conn, n int) [][]byte {
	t.Helper()
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	var buf, frames = []byte(nil), [][]byte(nil)
	chunk := make([]byte, 4096)
	for len(frames) < n {
		end, err := relay.FrameEnd(buf)
		if err != nil {
			t.Fatalf("reading replies: %v (%q)", err, buf)
		}
		if end > 0 {
			frames = append(frames, buf[:end])
			buf = buf[end:]
			continue
		}
		m, err := conn.Read(chunk)
		if err != nil {
			t.Fatalf("reading replies: %v (have %q)", err, frames)
		}
		buf = append(buf, chunk[:m]...)
	}
	return frames
}

// commandsTotal reads lockproxy_commands_total{cmd, result} from reg.
func commandsTotal(t *testing.T, reg *prometheus.Registry, cmd, result string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "lockproxy_commands_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			var c, r string
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "cmd":
					c = l.GetValue()
				case "result":
					r = l.GetValue()
				}
			}
			if c == cmd && r == result {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// TestCommandsTotalResultAfterFlush: a LOCK … WAIT flushes the replies of
// the commands pipelined before it, which empties the reply buffer, so
// the offset where its reply began before the flush says nothing of it.
// Its result in lockproxy_commands_total must be its own whatever came
// before: a -NOQUORUM is an error (it was counted ok after a PING), and a
// grant is ok (it was counted error when the byte at the old offset, here
// the token's first, was '-').
func TestCommandsTotalResultAfterFlush(t *testing.T) {
	for _, tc := range []struct {
		name   string
		b      backends.Backend
		before [][]string // pipelined ahead of the LOCK
		token  string
		want   string // the LOCK's result
	}{
		{"no quorum alone", &noQuorumBackend{}, nil, "t", "error"},
		{"no quorum after PING", &noQuorumBackend{}, [][]string{{"PING"}}, "t", "error"},
		{"no quorum after ECHO", &noQuorumBackend{}, [][]string{{"ECHO", "hello-world-hello"}}, "t", "error"},
		{"no quorum after two", &noQuorumBackend{}, [][]string{{"PING"}, {"ECHO", "x"}}, "t", "error"},
		{"granted alone", &fakeBackend{}, nil, "-tok", "ok"},
		// "$12\r\nabcdefghijkl\r\n" is 19 bytes: offset 19 of the grant's
		// reply is its token's first byte, '-'.
		{"granted after ECHO", &fakeBackend{}, [][]string{{"ECHO", "abcdefghijkl"}}, "-tok", "ok"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			conn := dialHandlerMetrics(t, tc.b, reg)
			var req []byte
			for _, c := range append(tc.before, []string{"LOCK", "k", "PX", "1000", "WAIT", "50", "TOKEN", tc.token}) {
				var args [][]byte
				for _, a := range c {
					args = append(args, []byte(a))
				}
				req = relay.AppendCommand(req, args)
			}
			if _, err := conn.Write(req); err != nil {
				t.Fatal(err)
			}
			frames := readFrames(t, conn, len(tc.before)+1)
			last := frames[len(frames)-1]
			if got := map[bool]string{true: "error", false: "ok"}[last[0] == '-']; got != tc.want {
				t.Fatalf("LOCK reply %q; want an %s reply", last, tc.want)
			}
			// The count is made before the batch's replies are written;
			// the reply read above came after it.
			other := map[string]string{"ok": "error", "error": "ok"}[tc.want]
			if got, bad := commandsTotal(t, reg, "lock", tc.want), commandsTotal(t, reg, "lock", other); got != 1 || bad != 0 {
				t.Errorf("lockproxy_commands_total{cmd=lock}: %s = %v, %s = %v; want %s = 1 (reply %q)", tc.want, got, other, bad, tc.want, last)
			}
		})
	}
}

// TestReplyFailed: the result of a command is read off its reply whatever
// happened to the reply buffer while it ran: a flush (LOCK … WAIT), the
// relay inserting replies of earlier relayed commands ahead of it (splice,
// relayOne), or taking an upstream reply it used back out (upstreamReply).
func TestReplyFailed(t *testing.T) {
	for _, tc := range []struct {
		name string
		pre  string               // buffered before the command
		run  func(w *resp.Writer) // the command
		want bool
	}{
		{"error", "+PONG\r\n", func(w *resp.Writer) { w.Error("ERR x") }, true},
		{"ok", "-ERR y\r\n", func(w *resp.Writer) { w.Int(1) }, false},
		{"nothing written", "-ERR y\r\n", func(w *resp.Writer) {}, false},
		{"nested error", "+PONG\r\n", func(w *resp.Writer) { w.Array(2); w.Int(1); w.Error("ERR e") }, false},
		{"error after flush", "+PONG\r\n", func(w *resp.Writer) { w.Reset(); w.Error("NOQUORUM") }, true},
		{"ok after flush", "$12\r\nabcdefghijkl\r\n", func(w *resp.Writer) {
			w.Reset()
			w.Map(1)
			w.BulkString("token")
			w.BulkString("-tok")
		}, false},
		{"nested error after flush", "+PONG\r\n", func(w *resp.Writer) {
			w.Reset()
			w.Array(2)
			w.Error("ERR e")
			w.Int(1)
		}, false},
		{"error after an inserted error", "+PONG\r\n", func(w *resp.Writer) {
			splice(w, 0, []byte("-ERR earlier\r\n:1\r\n"))
			w.Error("ERR mine")
		}, true},
		// At the end of the buffer the relay's earlier replies are
		// appended, with no reset, where the command's reply would start.
		{"ok after an appended error", "+PONG\r\n", func(w *resp.Writer) {
			splice(w, 7, []byte("-ERR earlier\r\n"))
			w.Simple("OK")
		}, false},
		{"error after an appended ok", "+PONG\r\n", func(w *resp.Writer) {
			splice(w, 7, []byte(":1\r\n+OK\r\n"))
			w.Error("ERR mine")
		}, true},
		{"ok after an upstream error taken out", "+PONG\r\n", func(w *resp.Writer) {
			at := w.Len()
			w.Raw([]byte("-ERR upstream\r\n"))
			head := append([]byte(nil), w.Bytes()[:at]...)
			w.Reset()
			w.Raw(head)
			w.Array(0)
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := resp.NewWriter()
			w.Raw([]byte(tc.pre))
			before, resets := w.Len(), w.Resets()
			tc.run(w)
			if got := replyFailed(w, before, resets); got != tc.want {
				t.Errorf("replyFailed = %v for buffer %q; want %v", got, w.Bytes(), tc.want)
			}
		})
	}
}

// TestReplyFailedAllocs: counting a command's result is on every local
// command's path, which allocates nothing for it.
func TestReplyFailedAllocs(t *testing.T) {
	w := resp.NewWriter()
	w.Simple("PONG")
	before, resets := w.Len(), w.Resets()
	w.Map(1)
	w.BulkString("token")
	w.Error("ERR nested")
	if n := testing.AllocsPerRun(100, func() { _ = replyFailed(w, before, resets) }); n != 0 {
		t.Errorf("replyFailed allocates %v times; want 0", n)
	}
	w.Reset()
	w.Error("NOQUORUM")
	if n := testing.AllocsPerRun(100, func() { _ = replyFailed(w, before, resets) }); n != 0 {
		t.Errorf("replyFailed after a reset allocates %v times; want 0", n)
	}
}
