package commands

import (
	"strings"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/test/harness"
)

// TestMultiRefusesConnectionCommandsAnsweredHere: inside MULTI lockproxy
// queued its own connection commands on the client's pinned upstream
// connection, so EXEC answered CLIENT ID with that connection's id (which
// names another lockproxy client in CLIENT UNBLOCK or TRACKING …
// REDIRECT), CLIENT GETNAME with its (no) name, INFO with the upstream's.
// EXEC's reply cannot be answered in part by lockproxy: they are refused,
// and the transaction aborts, as after any queuing error. Found by a
// review.
func TestMultiRefusesConnectionCommandsAnsweredHere(t *testing.T) {
	up := harness.StartRedis(t, harness.RedisOptions{})
	addr := defaultsProxy(t, up, 1)
	a := dialFrames(t, addr)
	if r := a.do("CLIENT SETNAME alice"); r != "+OK" {
		t.Fatalf("CLIENT SETNAME: %s", r)
	}
	id := a.do("CLIENT ID")
	for _, cmd := range []string{"CLIENT ID", "CLIENT GETNAME", "CLIENT INFO", "CLIENT LIST", "INFO server"} {
		t.Run(cmd, func(t *testing.T) {
			a.send("MULTI", "SET k v", cmd, "EXEC")
			got := a.readAll(4, 5*time.Second)
			if len(got) != 4 || got[0] != "+OK" || got[1] != "+QUEUED" {
				t.Fatalf("%s in MULTI: %q", cmd, got)
			}
			if !strings.HasPrefix(got[2], "-ERR") || !strings.HasPrefix(got[3], "-EXECABORT") {
				t.Errorf("%s in MULTI = %q, EXEC = %q; want a refusal and -EXECABORT (CLIENT ID outside: %s)", cmd, got[2], got[3], id)
			}
			if r := a.do("CLIENT GETNAME"); r != "$alice" {
				t.Errorf("CLIENT GETNAME after: %s", r)
			}
		})
	}
	if r := a.do("EXISTS k"); r != ":0" {
		t.Errorf("EXISTS k after the aborted transactions: %s; want :0", r)
	}
}
