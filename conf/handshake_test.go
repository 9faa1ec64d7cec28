package conf

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"testing"
	"time"
)

// TestHandshakeNoReply: Handshake names a server that never sent its
// hello (TLS towards a plain-text Redis, which waits for a command line)
// as such, and only that: a server that answers plain text, or a
// deadline that passed after the hello came, fail as before. A bare
// "timeout" would read as a slow or dead server.
func TestHandshakeNoReply(t *testing.T) {
	for _, tc := range []struct {
		name    string
		serve   func(net.Conn) // the server's side
		noReply bool
	}{
		{"silent", func(net.Conn) {}, true},
		{"plain text", func(c net.Conn) { _, _ = c.Write([]byte("-ERR unknown command\r\n")) }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			go func() {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				defer c.Close()
				tc.serve(c)
				time.Sleep(time.Second) // until the client gave up
			}()
			nc, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			_ = nc.SetDeadline(time.Now().Add(200 * time.Millisecond))
			err = Handshake(context.Background(), tls.Client(nc, &tls.Config{ServerName: "x", MinVersion: tls.VersionTLS12}))
			var nr *HandshakeNoReplyError
			if got := errors.As(err, &nr); err == nil || got != tc.noReply {
				t.Errorf("Handshake = %v; want an error, a *HandshakeNoReplyError: %v", err, tc.noReply)
			}
			if tc.noReply && (nr.Reason() != "tls handshake: no reply (is TLS enabled on this port?)" || !errors.Is(err, context.DeadlineExceeded) && !timeout(err)) {
				t.Errorf("Handshake = %v (reason %q); want the reason, wrapping the deadline", err, nr.Reason())
			}
		})
	}
}
