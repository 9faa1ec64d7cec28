package commands

import (
	"testing"

	"github.com/lockproxy/lockproxy/relay"
	"github.com/lockproxy/lockproxy/resp"
	"github.com/lockproxy/lockproxy/test/harness"
)

// TestLoopSafe: the batches the event loop may run are those that only
// relay plain commands, or only answer connection commands from memory;
// everything that waits, pins, filters, refuses or touches lock keys goes
// to the connection's goroutine.
func TestLoopSafe(t *testing.T) {
	// The relay has read the upstream's COMMAND table: until it has,
	// no relayed command runs on the loop (it would dial for it).
	up := relay.New(relay.Config{Addr: harness.StartRedis(t, harness.RedisOptions{}).Addr, PoolSize: 1,
		Deny: []string{"flushall", "client|kill"}, KeyPrefix: "lockproxy:"})
	defer up.Close()
	if up.MayWrite([]byte("get"), nil); !up.KnowsCommands() {
		t.Fatal("the relay did not read the upstream's COMMAND table")
	}
	unread := relay.New(relay.Config{Addr: harness.RefusedAddr(t), PoolSize: 1})
	defer unread.Close()
	unreadH := NewHandler(Options{Limits: testLimits, Backend: &fakeBackend{}, Relay: unread})
	defer unreadH.Close()
	h := NewHandler(Options{Limits: testLimits, Backend: &fakeBackend{}, Relay: up, LockPatterns: []string{"lock:*"}})
	defer h.Close()
	authH := NewHandler(Options{Limits: testLimits, Backend: &fakeBackend{}, Relay: up, Password: "pw"})
	defer authH.Close()
	noUp := NewHandler(Options{Limits: testLimits, Backend: &fakeBackend{}})
	defer noUp.Close()

	for _, tc := range []struct {
		name string
		h    *Handler
		cmds []string
		want bool
	}{
		{"get and set", h, []string{"GET a", "SET b 1", "hset h f v"}, true},
		{"connection commands", h, []string{"HELLO 3", "CLIENT SETINFO LIB-NAME x", "client setname n", "PING"}, true},
		{"mixed", h, []string{"PING", "GET a"}, false},
		{"lock command", h, []string{"LOCK k PX 100"}, false},
		{"unlock after get", h, []string{"GET a", "UNLOCK k t"}, false},
		{"transaction", h, []string{"MULTI"}, false},
		{"watch", h, []string{"WATCH a"}, false},
		{"blocking pop", h, []string{"BLPOP q 0"}, false},
		{"xread block", h, []string{"XREAD BLOCK 0 STREAMS s $"}, false},
		{"xread", h, []string{"XREAD STREAMS s 0"}, true},
		{"subscribe", h, []string{"SUBSCRIBE c"}, false},
		{"keys filtered", h, []string{"KEYS *"}, false},
		{"scan filtered", h, []string{"SCAN 0"}, false},
		{"denied", h, []string{"FLUSHALL"}, false},
		{"denied subcommand", h, []string{"CLIENT KILL ID 1"}, false},
		{"client tracking", h, []string{"CLIENT TRACKING ON"}, false},
		{"client list", h, []string{"CLIENT LIST"}, false},
		{"lock prefix", h, []string{"GET lockproxy:lock:k"}, false},
		{"transparent lock key", h, []string{"SET lock:a t NX PX 100"}, false},
		{"script", h, []string{"EVAL return 1 0"}, false},
		{"select", h, []string{"SELECT 1"}, false},
		{"quit", h, []string{"QUIT"}, false},
		{"info", h, []string{"INFO", "INFO server"}, true},
		{"command", h, []string{"COMMAND DOCS"}, false},
		{"no auth yet", authH, []string{"GET a"}, false},
		{"auth", authH, []string{"AUTH pw"}, true},
		{"hello with auth", authH, []string{"HELLO 3 AUTH default pw"}, true},
		{"no upstream", noUp, []string{"GET a"}, false},
		{"command table not read", unreadH, []string{"GET a"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &resp.Session{W: resp.NewWriter()}
			var cmds [][][]byte
			for _, c := range tc.cmds {
				cmds = append(cmds, words(c))
			}
			if got := tc.h.LoopSafe(s, cmds); got != tc.want {
				t.Errorf("LoopSafe(%q) = %v; want %v", tc.cmds, got, tc.want)
			}
		})
	}
}

// TestRelayPlainIsRelayNamedDefault: what relayPlain calls plain is what
// relayNamed relays with nothing else to do, so the loop's rule and the
// relay's cannot drift apart: every special case of relayNamed's switch
// is refused.
func TestRelayPlainIsRelayNamedDefault(t *testing.T) {
	for _, cmd := range []string{
		"MULTI", "EXEC", "DISCARD", "WATCH a", "UNWATCH", "SUBSCRIBE c", "PSUBSCRIBE p*", "SSUBSCRIBE c",
		"MONITOR", "UNSUBSCRIBE", "PUNSUBSCRIBE", "SUNSUBSCRIBE", "KEYS *", "SCAN 0", "CLIENT REPLY OFF",
		"CLIENT TRACKING ON", "BLPOP q 0", "BRPOP q 0", "BLMOVE a b LEFT RIGHT 0", "BZPOPMIN z 0",
		"WAIT 1 0", "WAITAOF 0 0 0", "XREADGROUP GROUP g c BLOCK 0 STREAMS s >",
	} {
		args := words(cmd)
		var buf [32]byte
		if relayPlain(string(resp.Lower(buf[:], args[0])), args) {
			t.Errorf("relayPlain(%q) = true; want false", cmd)
		}
	}
}
