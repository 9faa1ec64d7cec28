package lockclient

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// Config is how long one test package's helpers wait, and the shape of
// its go-redis clients. AcquireTimeout, CommandTimeout, DialTimeout and
// ReplyTimeout must be set for the helpers that use them; a zero
// ClientRead, ClientWrite or PoolSize leaves go-redis's default.
type Config struct {
	AcquireTimeout time.Duration // a LOCK or RLOCK reply, a WAIT included
	CommandTimeout time.Duration // any other command's reply (UNLOCK, RENEW, …)
	DialTimeout    time.Duration // connecting, for clients and raw connections
	ReplyTimeout   time.Duration // one reply on a raw connection

	// ClientRead and ClientWrite are go-redis's read and write timeouts;
	// ClientRead must leave room for LOCK … WAIT.
	ClientRead  time.Duration
	ClientWrite time.Duration
	PoolSize    int
}

// NewClient is a go-redis client of lockproxy at addr speaking RESP proto
// (2 or 3), closed at cleanup. It never retries (a retried LOCK could be
// granted twice) and does not send CLIENT SETINFO or maintenance
// notification handshakes, which lockproxy need not relay.
func (cf Config) NewClient(t testing.TB, addr string, proto int) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{
		Addr:            addr,
		Protocol:        proto,
		MaxRetries:      -1,
		DialTimeout:     cf.DialTimeout,
		ReadTimeout:     cf.ClientRead,
		WriteTimeout:    cf.ClientWrite,
		PoolSize:        cf.PoolSize,
		DisableIdentity: true,
		MaintNotificationsConfig: &maintnotifications.Config{
			Mode: maintnotifications.ModeDisabled,
		},
	})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// CtxFor returns a context that ends after d or with the test.
func CtxFor(t testing.TB, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// RandID is a short random hex string for unique keys and tokens.
func RandID() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// IsNoQuorum reports whether err is a -NOQUORUM reply: too few nodes
// answered within the node timeout, which a loaded test machine can cause.
func IsNoQuorum(err error) bool {
	return err != nil && strings.HasPrefix(err.Error(), "NOQUORUM")
}
