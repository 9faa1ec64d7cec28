package resp

import (
	"context"
	"crypto/tls"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// ctxBigHandler answers CTXBIG, once the connection's context ends, with a
// reply of 16 MB: a blocking command canceled by Shutdown past its
// deadline, whose (large) answer goes out in shutdownGrace.
type ctxBigHandler struct{ waiting atomic.Bool }

func (h *ctxBigHandler) ServeRESP(s *Session, args [][]byte) {
	if string(args[0]) != "CTXBIG" {
		s.W.Simple("OK")
		return
	}
	h.waiting.Store(true)
	<-s.Context().Done()
	s.W.Raw(ctxBigReply())
}

// ctxBigReply is built before the context ends (TestOutputLimitAfterContextEnds), once.
var ctxBigReply = sync.OnceValue(func() []byte {
	return []byte("$" + strconv.Itoa(16<<20) + "\r\n" + strings.Repeat("v", 16<<20) + "\r\n")
})

func (h *ctxBigHandler) Closed(*Session) {}

// TestOutputLimitAfterContextEnds: a client whose reply, written
// after its context ended (Shutdown past its deadline cancels every
// connection's; WatchClose cancels it too), takes it past MaxOutput is
// closed for its limit, logged and counted: over TLS as over TCP. The
// tlsSock took a canceled context for Close's close_notify, and closed
// the TLS client with net.ErrClosed, neither logged nor counted.
func TestOutputLimitAfterContextEnds(t *testing.T) {
	// Time for the reply to be written before Shutdown closes what is left.
	oldGrace := shutdownGrace
	shutdownGrace = 3 * time.Second
	t.Cleanup(func() { shutdownGrace = oldGrace })
	ctxBigReply()
	for _, overTLS := range []bool{false, true} {
		name := "TCP"
		if overTLS {
			name = "TLS"
		}
		t.Run(name, func(t *testing.T) {
			ln, server, client := tlsListener(t)
			core, logs := observer.New(zap.WarnLevel)
			h := &ctxBigHandler{}
			srv := &Server{Handler: h, MaxOutput: 1 << 20, Logger: zap.New(core)}
			if overTLS {
				srv.TLSConfig = server
			}
			done := make(chan error, 1)
			go func() { done <- srv.Serve(ln) }()
			raw := dialSmall(t, ln.Addr().String(), 0)
			c := raw
			if overTLS {
				tc := tls.Client(raw, client)
				if err := tc.Handshake(); err != nil {
					t.Fatal(err)
				}
				c = tc
			}
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
			mustWrite(t, c, []byte("CTXBIG\r\n"))
			if !waitUntil(time.Now().Add(5*time.Second), time.Millisecond, h.waiting.Load) {
				t.Fatal("CTXBIG not served")
			}
			ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
			defer cancel()
			_ = srv.Shutdown(ctx)
			<-done
			if got := srv.OutputLimitCloses(); got != 1 {
				t.Errorf("OutputLimitCloses = %d; want 1", got)
			}
			if got := logs.FilterMessageSnippet("output buffer limit").Len(); got != 1 {
				t.Errorf("%d log lines on the output limit; want 1", got)
			}
		})
	}
}
