package quorum_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/lockproxy/lockproxy/quorum"
)

// noReplyErr is a failure that names its cause and wraps the deadline
// that ended it, as conf.HandshakeNoReplyError does.
type noReplyErr struct{}

func (noReplyErr) Error() string  { return "tls handshake: no reply: context deadline exceeded" }
func (noReplyErr) Reason() string { return "tls handshake: no reply (is TLS enabled on this port?)" }
func (noReplyErr) Unwrap() error  { return context.DeadlineExceeded }

// TestReasonBeforeDeadline: an error that names its own cause is reported
// by it even when it wraps context.DeadlineExceeded: a TLS handshake that
// a plain-text node never answered ran out its deadline, and "timeout"
// would hide the misconfiguration. A bare deadline is still "timeout".
func TestReasonBeforeDeadline(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{fmt.Errorf("tls with n1: %w", noReplyErr{}), "tls handshake: no reply (is TLS enabled on this port?)"},
		{fmt.Errorf("dial n1: %w", context.DeadlineExceeded), "timeout"},
	} {
		if got := quorum.Reason(tc.err); got != tc.want {
			t.Errorf("Reason(%v) = %q; want %q", tc.err, got, tc.want)
		}
	}
}
