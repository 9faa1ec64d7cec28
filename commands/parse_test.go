package commands

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/resp"
)

// testLimits are conf.Default()'s locks.* values, with small key and token
// caps so the length checks are easy to reach.
var testLimits = Limits{
	DefaultTTL:    30 * time.Second,
	MinTTL:        10 * time.Millisecond,
	MaxTTL:        10 * time.Minute,
	MaxWait:       10 * time.Minute,
	MaxKeyBytes:   16,
	MaxTokenBytes: 8,
}

// words splits a command line on single spaces; two spaces make an empty
// argument.
func words(line string) [][]byte {
	parts := strings.Split(line, " ")
	out := make([][]byte, len(parts))
	for i, p := range parts {
		out[i] = []byte(p)
	}
	return out
}

func TestParseLock(t *testing.T) {
	const def = 30 * time.Second
	for _, tc := range []struct {
		line      string
		ttl       time.Duration
		wait      time.Duration
		token     string // "" for none
		wantToken bool
		keepalive bool
		maxHold   time.Duration
	}{
		{line: "LOCK k", ttl: def, keepalive: true},
		{line: "LOCK lock:orders", ttl: def, keepalive: true},
		{line: "LOCK k 5000", ttl: 5 * time.Second},
		{line: "LOCK k 10", ttl: 10 * time.Millisecond},
		{line: "LOCK k PX 5000", ttl: 5 * time.Second},
		{line: "LOCK k px 5000", ttl: 5 * time.Second},
		{line: "lock k pX 5000", ttl: 5 * time.Second},
		{line: "LOCK k EX 5", ttl: 5 * time.Second},
		{line: "LOCK k ex 30", ttl: 30 * time.Second},
		{line: "LOCK k PX 10", ttl: 10 * time.Millisecond}, // locks.min_ttl
		{line: "LOCK k PX 600000", ttl: 10 * time.Minute},  // locks.max_ttl
		{line: "LOCK k EX 600", ttl: 10 * time.Minute},     // locks.max_ttl
		{line: "LOCK k WAIT 100", ttl: def, keepalive: true, wait: 100 * time.Millisecond},
		{line: "LOCK k wait 0", ttl: def, keepalive: true},
		{line: "LOCK k WAIT 600000", ttl: def, keepalive: true, wait: 10 * time.Minute}, // locks.max_wait
		{line: "LOCK k TOKEN abc", ttl: def, keepalive: true, token: "abc", wantToken: true},
		{line: "LOCK k token 12345678", ttl: def, keepalive: true, token: "12345678", wantToken: true}, // at the cap
		{line: "LOCK k TOKEN PX", ttl: def, keepalive: true, token: "PX", wantToken: true},
		{line: "LOCK k PX 2000 WAIT 100 TOKEN t", ttl: 2 * time.Second, wait: 100 * time.Millisecond, token: "t", wantToken: true},
		{line: "LOCK k TOKEN t WAIT 100 PX 2000", ttl: 2 * time.Second, wait: 100 * time.Millisecond, token: "t", wantToken: true},
		{line: "LOCK k WAIT 100 TOKEN t EX 2", ttl: 2 * time.Second, wait: 100 * time.Millisecond, token: "t", wantToken: true},
		{line: "LOCK k wait 5 token T ex 1", ttl: time.Second, wait: 5 * time.Millisecond, token: "T", wantToken: true},
		{line: "LOCK k 5000 WAIT 100 TOKEN t", ttl: 5 * time.Second, wait: 100 * time.Millisecond, token: "t", wantToken: true},
		{line: "LOCK 0123456789abcdef PX 100", ttl: 100 * time.Millisecond}, // key at the cap
		{line: "LOCK 5000 PX 100", ttl: 100 * time.Millisecond},             // a numeric key
		{line: "LOCK k\x00\xff TOKEN \r\n PX 100", ttl: 100 * time.Millisecond, token: "\r\n", wantToken: true},

		// KEEPALIVE, anywhere among the options, and MAXHOLD with it.
		{line: "LOCK k KEEPALIVE", ttl: def, keepalive: true},
		{line: "LOCK k keepalive", ttl: def, keepalive: true},
		{line: "LOCK k PX 600 KEEPALIVE", ttl: 600 * time.Millisecond, keepalive: true},
		{line: "LOCK k KEEPALIVE EX 2", ttl: 2 * time.Second, keepalive: true},
		{line: "LOCK k 100 KEEPALIVE", ttl: 100 * time.Millisecond, keepalive: true},
		{line: "LOCK k KEEPALIVE PX 100 WAIT 5 TOKEN t", ttl: 100 * time.Millisecond, wait: 5 * time.Millisecond,
			token: "t", wantToken: true, keepalive: true},
		{line: "LOCK k KEEPALIVE KEEPALIVE", ttl: def, keepalive: true},
		{line: "LOCK k MAXHOLD 60000", ttl: def, keepalive: true, maxHold: time.Minute},
		{line: "LOCK k maxhold 30000", ttl: def, keepalive: true, maxHold: def}, // equal to the TTL
		{line: "LOCK k PX 600 KEEPALIVE MAXHOLD 5000", ttl: 600 * time.Millisecond, keepalive: true, maxHold: 5 * time.Second},
		{line: "LOCK k MAXHOLD 5000 KEEPALIVE PX 600", ttl: 600 * time.Millisecond, keepalive: true, maxHold: 5 * time.Second},
		{line: "LOCK k MAXHOLD 86400000", ttl: def, keepalive: true, maxHold: 24 * time.Hour}, // not capped by locks.max_ttl
	} {
		t.Run(tc.line, func(t *testing.T) {
			args := words(tc.line)
			a, err := testLimits.parseLock("lock", args)
			if err != nil {
				t.Fatalf("LOCK %q = %v; want ttl %v", args[1:], err, tc.ttl)
			}
			if string(a.key) != string(args[1]) {
				t.Errorf("LOCK %q: key %q; want %q", args[1:], a.key, args[1])
			}
			if a.ttl != tc.ttl || a.wait != tc.wait {
				t.Errorf("LOCK %q: ttl %v, wait %v; want ttl %v, wait %v", args[1:], a.ttl, a.wait, tc.ttl, tc.wait)
			}
			if (a.token != nil) != tc.wantToken || string(a.token) != tc.token {
				t.Errorf("LOCK %q: token %q (set %v); want %q (set %v)", args[1:], a.token, a.token != nil, tc.token, tc.wantToken)
			}
			if a.keepalive != tc.keepalive || a.maxHold != tc.maxHold {
				t.Errorf("LOCK %q: keepalive %v, maxhold %v; want %v, %v", args[1:], a.keepalive, a.maxHold, tc.keepalive, tc.maxHold)
			}
		})
	}
}

func TestParseLockErrors(t *testing.T) {
	const (
		syntax    = "ERR syntax error"
		notInt    = "ERR value is not an integer or out of range"
		badExpire = "ERR invalid expire time in 'lock' command"
		badHold   = "ERR invalid MAXHOLD in 'lock' command"
		holdNeeds = "ERR MAXHOLD applies to KEEPALIVE locks only"
	)
	for _, tc := range []struct {
		line string
		want string
	}{
		// Unknown or incomplete options.
		{"LOCK k FOO", syntax},
		{"LOCK k FOO bar", syntax},
		{"LOCK k NX", syntax},
		{"LOCK k PX", syntax},
		{"LOCK k EX", syntax},
		{"LOCK k WAIT", syntax},
		{"LOCK k TOKEN", syntax},
		{"LOCK k PX 100 extra", syntax},
		{"LOCK k abc", syntax},
		{"LOCK k 01", syntax}, // not a bare TTL, so an option
		{"LOCK k TOKEN t 5000", syntax},
		{"LOCK k PXX 100", syntax},
		{"LOCK k  100", syntax}, // an empty option word

		// Values that are not integers.
		{"LOCK k PX abc", notInt},
		{"LOCK k PX 1.5", notInt},
		{"LOCK k PX 01", notInt},
		{"LOCK k PX +5", notInt},
		{"LOCK k PX 9223372036854775808", notInt},
		{"LOCK k PX ", notInt},
		{"LOCK k EX abc", notInt},
		{"LOCK k EX 1e3", notInt},
		{"LOCK k WAIT abc", notInt},
		{"LOCK k WAIT 1s", notInt},

		// Expire times Redis rejects.
		{"LOCK k PX 0", badExpire},
		{"LOCK k PX -1", badExpire},
		{"LOCK k EX 0", badExpire},
		{"LOCK k EX -5", badExpire},
		{"LOCK k 0", badExpire},
		{"LOCK k -1", badExpire},
		{"LOCK k PX 4611686018428", badExpire}, // above 2^62 ns
		{"LOCK k EX 4611686019", badExpire},
		{"LOCK k PX 9223372036854775807", badExpire},
		{"LOCK k EX 9223372036854775807", badExpire},

		// One TTL, one WAIT, one TOKEN.
		{"LOCK k PX 1 EX 1", syntax},
		{"LOCK k EX 1 PX 1", syntax},
		{"LOCK k PX 1 PX 1", syntax},
		{"LOCK k 5000 PX 100", syntax},
		{"LOCK k 5000 EX 1", syntax},
		{"LOCK k WAIT 1 WAIT 2", syntax},
		{"LOCK k TOKEN a TOKEN b", syntax},
		{"LOCK k TOKEN a token a", syntax},

		// Keys and tokens.
		{"LOCK ", "ERR empty key: lock keys must be at least one byte"},
		{"LOCK  PX 100", "ERR empty key: lock keys must be at least one byte"},
		{"LOCK 0123456789abcdefX", "ERR key too long"},
		{"LOCK k TOKEN ", "ERR empty token"},
		{"LOCK k TOKEN  PX 100", "ERR empty token"},
		{"LOCK k TOKEN 123456789", "ERR token too long"},

		// Limits.
		{"LOCK k PX 600001", "ERR TTL 600001 ms is above the maximum of 600000 ms (locks.max_ttl)"},
		{"LOCK k 600001", "ERR TTL 600001 ms is above the maximum of 600000 ms (locks.max_ttl)"},
		{"LOCK k EX 601", "ERR TTL 601000 ms is above the maximum of 600000 ms (locks.max_ttl)"},
		{"LOCK k EX 4611686018", "ERR TTL 4611686018000 ms is above the maximum of 600000 ms (locks.max_ttl)"},
		{"LOCK k PX 9", "ERR TTL 9 ms is below the minimum of 10 ms (locks.min_ttl)"},
		{"LOCK k 9", "ERR TTL 9 ms is below the minimum of 10 ms (locks.min_ttl)"},
		{"LOCK k WAIT -1", "ERR WAIT must not be negative"},
		{"LOCK k WAIT 600001", "ERR WAIT 600001 ms is above the maximum of 600000 ms (locks.max_wait)"},
		{"LOCK k WAIT 9223372036854775807", "ERR WAIT 9223372036854775807 ms is above the maximum of 600000 ms (locks.max_wait)"},
		{"LOCK k WAIT 9223372036855", "ERR WAIT 9223372036855 ms is above the maximum of 600000 ms (locks.max_wait)"},

		// KEEPALIVE and MAXHOLD.
		{"LOCK k KEEPALIVE FOO", syntax},
		{"LOCK k KEEPALIVE PX 0", badExpire},
		{"LOCK k KEEPALIVE PX 600001", "ERR TTL 600001 ms is above the maximum of 600000 ms (locks.max_ttl)"},
		{"LOCK k MAXHOLD", syntax},
		{"LOCK k MAXHOLD 5000 MAXHOLD 5000", syntax},
		{"LOCK k MAXHOLD abc", notInt},
		{"LOCK k MAXHOLD 1.5", notInt},
		{"LOCK k MAXHOLD 0", badHold},
		{"LOCK k MAXHOLD -1", badHold},
		{"LOCK k MAXHOLD 9223372036854775807", badHold},
		{"LOCK k PX 100 MAXHOLD 5000", holdNeeds},
		{"LOCK k 100 MAXHOLD 5000", holdNeeds},
		{"LOCK k MAXHOLD 29999", "ERR MAXHOLD 29999 ms is below the lock's TTL of 30000 ms"},
		{"LOCK k PX 600 KEEPALIVE MAXHOLD 599", "ERR MAXHOLD 599 ms is below the lock's TTL of 600 ms"},
	} {
		t.Run(tc.line, func(t *testing.T) {
			args := words(tc.line)
			_, err := testLimits.parseLock("lock", args)
			if err == nil || err.Error() != tc.want {
				t.Errorf("LOCK %q = %v; want %q", args[1:], err, tc.want)
			}
		})
	}
}

// TestParseLockNamesCommand: errors that name the command name the one
// that was sent.
func TestParseLockNamesCommand(t *testing.T) {
	_, err := testLimits.parseLock("rlock", words("RLOCK k PX 0"))
	if want := "ERR invalid expire time in 'rlock' command"; err == nil || err.Error() != want {
		t.Errorf("RLOCK k PX 0 = %v; want %q", err, want)
	}
}

// TestParseLockBareTTLMatchesPX: "A bare integer right after the key is a
// TTL in ms", so LOCK k N must mean LOCK k PX N, for every N.
func TestParseLockBareTTLMatchesPX(t *testing.T) {
	for _, n := range []string{
		"1", "9", "10", "5000", "600000", "600001",
		"4611686018427", // the largest PX parseTTL lets through
		"4611686018428", // the smallest PX it rejects
		"9223372036855", // n ms overflows int64 nanoseconds
		"10000000000000",
		"288230376151741744", // 30000 + 2^58: n*1e6 wraps to exactly 30 s
		"92233720700000",     // found by FuzzParseLock: wraps to 5m31.45224192s
		"9223372036854775807",
	} {
		t.Run(n, func(t *testing.T) {
			bare, bareErr := testLimits.parseLock("lock", words("LOCK k "+n))
			px, pxErr := testLimits.parseLock("lock", words("LOCK k PX "+n))
			switch {
			case errText(bareErr) != errText(pxErr):
				t.Errorf("LOCK k %s = ttl %v, %v; want %v, as LOCK k PX %s", n, bare.ttl, errText(bareErr), errText(pxErr), n)
			case bareErr == nil && bare.ttl != px.ttl:
				t.Errorf("LOCK k %s: ttl %v; want %v, as LOCK k PX %s", n, bare.ttl, px.ttl, n)
			}
		})
	}
}

func errText(err error) string {
	if err == nil {
		return "<nil>"
	}
	return err.Error()
}

// FuzzParseLock: any argument vector parses without panicking into either
// a lock within the limits whose TTL comes from the arguments (or is the
// default), or an error with an "ERR " text.
func FuzzParseLock(f *testing.F) {
	// The PROTOCOL.md forms, and its error cases.
	for _, s := range []string{
		"k",
		"lock:orders PX 30000",
		"lock:orders EX 30",
		"k PX 30000 WAIT 5000 TOKEN 0123abcd KEEPALIVE",
		"k EX 30 WAIT 5000 TOKEN t",
		"k 5000",
		"k WAIT 100",
		"k TOKEN abc",
		"k KEEPALIVE",
		"k PX 600 KEEPALIVE MAXHOLD 5000",
		"k MAXHOLD 60000",
		"k PX 100 MAXHOLD 5000",
		"k PX 1 EX 1",
		"k PX abc",
		"k PX 0",
		"k PX -1",
		"k WAIT 1 WAIT 2",
		"k TOKEN a TOKEN b",
		" PX 100",
		"k TOKEN ",
		"k PX 600001",
		"k 9223372036854775807",
		"k WAIT 9223372036854775807",
		"k px 10 wait 0 token x",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, line string) {
		args := words("LOCK " + line)
		a, err := testLimits.parseLock("lock", args)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "ERR ") {
				t.Fatalf("LOCK %q = %q; want an error starting with \"ERR \"", args[1:], err)
			}
			if strings.ContainsAny(err.Error(), "\r\n") {
				t.Fatalf("LOCK %q = %q; an error text must be one line", args[1:], err)
			}
			return
		}
		if len(args) > 2 {
			if n, ok := resp.ParseInt(args[2]); ok && n > int64(1<<62)/int64(time.Millisecond) {
				// Known: a bare TTL this large overflows (TestParseLockBareTTLMatchesPX
				// fails until it is fixed); keep the fuzzer looking for others.
				return
			}
		}
		l := testLimits
		switch {
		case a.ttl < l.MinTTL || a.ttl > l.MaxTTL:
			t.Fatalf("LOCK %q: ttl %v; want in [%v, %v]", args[1:], a.ttl, l.MinTTL, l.MaxTTL)
		case a.wait < 0 || a.wait > l.MaxWait:
			t.Fatalf("LOCK %q: wait %v; want in [0, %v]", args[1:], a.wait, l.MaxWait)
		case len(a.key) == 0 || len(a.key) > l.MaxKeyBytes:
			t.Fatalf("LOCK %q: key %q; want 1 to %d bytes", args[1:], a.key, l.MaxKeyBytes)
		case a.token != nil && (len(a.token) == 0 || len(a.token) > l.MaxTokenBytes):
			t.Fatalf("LOCK %q: token %q; want 1 to %d bytes", args[1:], a.token, l.MaxTokenBytes)
		case a.maxHold != 0 && (!a.keepalive || a.maxHold < a.ttl):
			t.Fatalf("LOCK %q: maxhold %v with keepalive %v, ttl %v; want only under KEEPALIVE and >= the TTL", args[1:], a.maxHold, a.keepalive, a.ttl)
		case !ttlFromArgs(a.ttl, args, l.DefaultTTL):
			t.Fatalf("LOCK %q: ttl %v is neither the default nor any argument", args[1:], a.ttl)
		}
	})
}

// ttlFromArgs reports whether ttl is the default or is spelled by one of
// the arguments, in ms or (after EX) in s.
func ttlFromArgs(ttl time.Duration, args [][]byte, def time.Duration) bool {
	if ttl == def {
		return true
	}
	ms := strconv.FormatInt(ttl.Milliseconds(), 10)
	for i, a := range args[2:] {
		if string(a) == ms && ttl%time.Millisecond == 0 {
			return true
		}
		if i > 0 && strings.EqualFold(string(args[2+i-1]), "EX") && ttl%time.Second == 0 &&
			string(a) == strconv.FormatInt(int64(ttl/time.Second), 10) {
			return true
		}
	}
	return false
}
