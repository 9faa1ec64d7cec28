package zookeeper

import (
	"reflect"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/lockproxy/lockproxy/backends"
)

// TestValidityCappedByNegotiatedSession proves that validity is capped by
// the session timeout the server negotiated, not the one asked for: the
// harness's servers clamp a 90 s session to their maxSessionTimeout (60 s),
// and a holder cut off is then lost after 60 s, so a validity counted on
// 90 s (37.5 s, 5/12 of it) would outlive the lock. The instance reads the
// negotiated timeout from the session handshake (go-zookeeper keeps it in
// an unexported field, read here to check) and warns of it.
func TestValidityCappedByNegotiatedSession(t *testing.T) {
	t.Parallel()
	root := testRoot(t)
	core, logs := observer.New(zap.WarnLevel)
	const asked = 90 * time.Second
	a, err := New(Config{Servers: []string{zkAddr}, Root: root, SessionTimeout: asked,
		DriftFactor: 0.01, DriftMin: 2 * time.Millisecond, StartTimeout: 30 * time.Second, Logger: zap.New(core)})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	defer a.Close()
	neg := time.Duration(reflect.ValueOf(a.conn).Elem().FieldByName("sessionTimeoutMs").Int()) * time.Millisecond
	if neg >= asked {
		t.Fatalf("negotiated %v; the test needs a server whose maxSessionTimeout is below %v", neg, asked)
	}
	if got := a.sessionTimeout(); got != neg {
		t.Errorf("sessionTimeout() = %v; want the negotiated %v", got, neg)
	}
	l := mustLock(t, a, "neg", "A", 120*time.Second, backends.Write)
	if limit := neg * 5 / 12; l.Validity > limit {
		t.Errorf("LOCK validity %v (session asked %v, negotiated %v); want at most %v", l.Validity, asked, neg, limit)
	}
	if logs.FilterField(zap.Duration("negotiated", neg)).Len() != 1 {
		t.Errorf("no warning of the negotiated session timeout; logged %v", logs.All())
	}
}
