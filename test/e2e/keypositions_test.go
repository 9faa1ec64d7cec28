package e2e

import (
	"strings"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/test/harness"
	"github.com/lockproxy/lockproxy/test/lockclient"
)

// TestAuthPermissionsKeyPositionsLikeRedis: a user limited to key and
// channel patterns is refused by lockproxy exactly when redis-server,
// given the same rules, refuses it (NOPERM), where Redis's key positions
// are not the COMMAND table's first/last/step: a shard channel
// (SPUBLISH, SSUBSCRIBE, SUNSUBSCRIBE) is marked "not a key" in its key
// specs and is checked against the channel patterns only, and MIGRATE's
// "" placeholder before a KEYS clause is no key.
func TestAuthPermissionsKeyPositionsLikeRedis(t *testing.T) {
	t.Parallel()
	cl := startCluster(t, 3)
	up := harness.StartRedis(t, harness.RedisOptions{})
	in := startInstanceEnv(t, cl.addrs(), []string{
		"LOCKPROXY_UPSTREAM_ADDRESS=" + up.Addr,
		"LOCKPROXY_AUTH_USERS=app:app-pw",
		"LOCKPROXY_AUTH_PERMISSIONS=app ~app:* &news.* +@all",
	})
	ctx := lockclient.CtxFor(t, 30*time.Second)
	if err := up.Client(t).Do(ctx, "ACL", "SETUSER", "app", "on", ">app-pw", "~app:*", "resetchannels", "&news.*", "+@all").Err(); err != nil {
		t.Fatal(err)
	}
	ref := lc.DialRaw(t, up.Addr)
	c := lc.DialRaw(t, in.addr)
	for _, conn := range []*lockclient.RawConn{ref, c} {
		if r := conn.Do("AUTH", "app", "app-pw"); r.Str != "OK" {
			t.Fatalf("AUTH = %v", r)
		}
	}
	for _, args := range [][]string{
		{"SPUBLISH", "news.x", "m"},
		{"SPUBLISH", "sport", "m"},
		{"SPUBLISH", "app:x", "m"},
		{"MIGRATE", "127.0.0.1", "1", "", "0", "100", "KEYS", "app:x"},
		{"MIGRATE", "127.0.0.1", "1", "", "0", "100", "KEYS", "other"},
		{"MIGRATE", "127.0.0.1", "1", "", "0", "100", "COPY", "KEYS", "app:x", "app:y"},
		{"MIGRATE", "127.0.0.1", "1", "", "0", "100", "AUTH", "keys", "KEYS", "app:x"},
		{"MIGRATE", "127.0.0.1", "1", "app:x", "0", "100"},
		{"MIGRATE", "127.0.0.1", "1", "other", "0", "100"},
	} {
		want := ref.Do(args...)
		got := c.Do(args...)
		wantRefused := want.Kind == '-' && strings.HasPrefix(want.Str, "NOPERM")
		gotRefused := got.Kind == '-' && strings.HasPrefix(got.Str, "NOPERM")
		if wantRefused != gotRefused {
			t.Errorf("%q: lockproxy = %v, redis-server = %v", args, got, want)
		}
	}
}
