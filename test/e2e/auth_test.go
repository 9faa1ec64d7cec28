package e2e

import (
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/lockproxy/lockproxy/test/lockclient"
)

// TestAuthPassword: with auth.password set, a connection must AUTH (or
// HELLO … AUTH) before anything else, as with Redis's requirepass; go-redis
// given the password works under RESP2 (AUTH) and RESP3 (HELLO 3 AUTH);
// RESET signs the connection out.
func TestAuthPassword(t *testing.T) {
	t.Parallel()
	cl := startCluster(t, 3)
	in := startInstanceEnv(t, cl.addrs(), []string{"LOCKPROXY_AUTH_PASSWORD=s3cret"})

	rc := lc.DialRaw(t, in.addr)
	for _, step := range []struct {
		args []string
		want string // prefix of the reply, Kind included
	}{
		{[]string{"PING"}, "-NOAUTH"},
		{[]string{"LOCK", "k", "PX", "1000"}, "-NOAUTH"},
		{[]string{"HELLO", "3"}, "-NOAUTH"},
		{[]string{"AUTH", "wrong"}, "-WRONGPASS"},
		{[]string{"AUTH", "someone", "s3cret"}, "-WRONGPASS"},
		{[]string{"AUTH", "s3cret"}, "+OK"},
		{[]string{"PING"}, "+PONG"},
		{[]string{"RESET"}, "+RESET"},
		{[]string{"PING"}, "-NOAUTH"},
		{[]string{"AUTH", "default", "s3cret"}, "+OK"},
		{[]string{"PING"}, "+PONG"},
	} {
		r := rc.Do(step.args...)
		got := string(r.Kind) + r.Str
		if !strings.HasPrefix(got, step.want) {
			t.Fatalf("%v = %v; want %s…", step.args, r, step.want)
		}
	}

	for _, proto := range []int{2, 3} {
		c := redis.NewClient(&redis.Options{
			Addr: in.addr, Protocol: proto, Password: "s3cret", MaxRetries: -1, DisableIdentity: true,
			MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
		})
		g, ok, err := lockclient.TryLock(lockclient.CtxFor(t, 10*time.Second), c, "auth-"+lockclient.RandID(), "PX", 5000)
		if err != nil || !ok || g.Fence == 0 {
			t.Errorf("RESP%d with the password: LOCK = %+v, %v, %v; want a grant", proto, g, ok, err)
		}
		_ = c.Close()
		bad := redis.NewClient(&redis.Options{
			Addr: in.addr, Protocol: proto, Password: "nope", MaxRetries: -1, DisableIdentity: true,
			MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
		})
		if err := bad.Ping(lockclient.CtxFor(t, 10*time.Second)).Err(); err == nil || !strings.Contains(err.Error(), "WRONGPASS") {
			t.Errorf("RESP%d with a wrong password: PING = %v; want WRONGPASS", proto, err)
		}
		_ = bad.Close()
	}
}
