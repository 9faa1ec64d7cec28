package redis

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

// logEvery is how often one kind of go-redis log line (one format string)
// is written: a node that is down makes the pool log each failed dial, and
// the health checks dial several times a second.
const logEvery = 10 * time.Second

// SetGoRedisLogger sends go-redis's own log lines (a pool that cannot
// dial, a connection dropped as unhealthy) to log, as warnings, at most
// one per kind every logEvery with the number held back since. Without it
// go-redis writes plain-text lines to stderr, in the middle of the JSON
// that log collectors parse (log.format json). go-redis's logger is
// global: the command installs it once, before any node is made.
func SetGoRedisLogger(log *zap.Logger) {
	goredis.SetLogger(newGoRedisLogger(log, logEvery))
}

// goRedisLogger is a go-redis Logging that writes to zap, rate-limited
// per format string.
type goRedisLogger struct {
	log   *zap.Logger
	every time.Duration
	now   func() time.Time

	mu    sync.Mutex
	kinds map[string]*logKind
}

// logKind is one format string's state: when it was last written, and
// how many lines were held back since.
type logKind struct {
	last time.Time
	held int
}

// maxLogKinds bounds the state: go-redis's formats are constants, so this
// is never reached unless it logs user text as a format.
const maxLogKinds = 256

func newGoRedisLogger(log *zap.Logger, every time.Duration) *goRedisLogger {
	// The caller shown is go-redis's line that logged, two frames up:
	// through go-redis's forwarding logger, then this Printf.
	log = log.Named("go-redis").WithOptions(zap.AddCallerSkip(2))
	return &goRedisLogger{log: log, every: every, now: time.Now, kinds: map[string]*logKind{}}
}

// Printf is go-redis's logging call.
func (l *goRedisLogger) Printf(_ context.Context, format string, v ...any) {
	now := l.now()
	l.mu.Lock()
	k := l.kinds[format]
	if k == nil {
		if len(l.kinds) >= maxLogKinds {
			clear(l.kinds)
		}
		k = &logKind{}
		l.kinds[format] = k
	}
	if !k.last.IsZero() && now.Sub(k.last) < l.every {
		k.held++
		l.mu.Unlock()
		return
	}
	held := k.held
	k.last, k.held = now, 0
	l.mu.Unlock()

	// go-redis prefixes most lines with "redis: ": the logger's name
	// says where they come from.
	msg := strings.TrimPrefix(fmt.Sprintf(format, v...), "redis: ")
	if held > 0 {
		l.log.Warn(msg, zap.Int("held_back", held), zap.Duration("since", l.every))
		return
	}
	l.log.Warn(msg)
}
