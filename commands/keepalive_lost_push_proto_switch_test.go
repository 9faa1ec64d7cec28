package commands

import (
	"bytes"
	"net"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/relay"
)

// TestLostPushNeverFollowsSwitchToRESP2 proves that a connection that
// leaves RESP3 (HELLO 2, RESET) gets no lock-lost push after the reply
// that switched it: a RESP2 parser (redis-py's, ioredis's and go-redis's
// in RESP2 mode) cannot read a '>' frame and fails or desynchronizes on
// it, and Redis never sends one to a RESP2 client. The loss is still told
// by the connection's next command on the lock (-LOCKLOST), except after
// RESET, which drops the connection's notices with its KEEPALIVE locks
// (the connection as if new, maybe lent to another user). A client holds
// a KEEPALIVE lock and pipelines a slow LOCK with the switch; the lock is
// lost while the slow LOCK runs. Before, the push queued then waited for
// the batch's replies and went out after the switch's reply, in RESP3.
func TestLostPushNeverFollowsSwitchToRESP2(t *testing.T) {
	for _, tc := range []struct {
		name   string
		cmd    []string
		want   string // how the switch's reply begins
		notice bool   // the next command on the lock is told of the loss
	}{
		{"HELLO 2", []string{"HELLO", "2"}, "*14\r\n", true},
		{"RESET", []string{"RESET"}, "+RESET\r\n", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := &slowKeyBackend{delay: 1500 * time.Millisecond}
			b.renewZero = true // the watchdog's first renewal (+1 s) finds the lock gone
			conn := dialHandler(t, b)
			defer conn.Close()
			send := func(cmds ...[]string) {
				var out []byte
				for _, args := range cmds {
					var cmd [][]byte
					for _, a := range args {
						cmd = append(cmd, []byte(a))
					}
					out = relay.AppendCommand(out, cmd)
				}
				if _, err := conn.Write(out); err != nil {
					t.Fatal(err)
				}
			}
			send([]string{"HELLO", "3"}, []string{"LOCK", "k", "PX", "3000", "KEEPALIVE", "TOKEN", "t"})
			readFrames(t, conn, 2)
			time.Sleep(300 * time.Millisecond)
			// One batch: the slow LOCK runs past the loss, then the switch.
			send([]string{"LOCK", "slow", "PX", "3000"}, tc.cmd, []string{"PING"})
			rd := &frameReader{conn: conn}
			frames := rd.until(t, func(f []byte) bool { return string(f) == "+PONG\r\n" })
			// The loss is still told, by the next command on the lock,
			// unless RESET dropped the notice.
			send([]string{"UNLOCK", "k", "t"})
			frames = append(frames, rd.until(t, func(f []byte) bool { return f[0] != '>' })...)
			if r := frames[len(frames)-1]; bytes.HasPrefix(r, []byte("-LOCKLOST ")) != tc.notice {
				t.Errorf("UNLOCK k t after the loss and %s = %q; want -LOCKLOST: %v", tc.name, r, tc.notice)
			}
			switched := -1
			for i, f := range frames {
				if switched < 0 && bytes.HasPrefix(f, []byte(tc.want)) {
					switched = i
				}
				if switched >= 0 && len(f) > 0 && f[0] == '>' {
					t.Errorf("frame %d, after %s's reply, is a RESP3 push on a RESP2 connection: %q (all: %q)", i, tc.name, f, frames)
				}
			}
			if switched < 0 {
				t.Fatalf("no reply to %s among %q", tc.name, frames)
			}
		})
	}
}

// frameReader reads frames from conn, keeping what it read past them for
// the next call.
type frameReader struct {
	conn net.Conn
	buf  []byte
}

// until reads frames up to the first that last accepts, for replies whose
// count the test cannot know (pushes among them).
func (r *frameReader) until(t *testing.T, last func([]byte) bool) [][]byte {
	t.Helper()
	_ = r.conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	var frames [][]byte
	chunk := make([]byte, 4096)
	for len(frames) == 0 || !last(frames[len(frames)-1]) {
		end, err := relay.FrameEnd(r.buf)
		if err != nil {
			t.Fatalf("reading replies: %v (%q)", err, r.buf)
		}
		if end > 0 {
			frames = append(frames, r.buf[:end:end])
			r.buf = r.buf[end:]
			continue
		}
		m, err := r.conn.Read(chunk)
		if err != nil {
			t.Fatalf("reading replies: %v (have %q)", err, frames)
		}
		r.buf = append(r.buf, chunk[:m]...)
	}
	return frames
}
