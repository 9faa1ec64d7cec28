package transparent

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockproxy/lockproxy/test/lockclient"
)

// TestMultiKeyCommandsWaitOneTimeoutForAPausedNode: DEL, UNLINK and
// EXISTS with several lock keys count each key by its own majority, but
// must not wait for a paused node (SIGSTOP) once per key. A write waits for
// every node up to its timeout (1 s here), so a DEL of six keys run one key
// after the other took six timeouts. EXISTS, a read, is answered as soon as
// a majority agrees, and one that needs the paused node's answer (the two
// others disagree) ends at its first key's "no majority": it took one
// timeout before too, and is kept here so that it stays so.
func TestMultiKeyCommandsWaitOneTimeoutForAPausedNode(t *testing.T) {
	t.Parallel()
	const nkeys = 6
	for _, tc := range []struct {
		name    string
		cmd     string
		onNodes []int  // where each key is placed before the command
		want    int64  // the reply, when wantErr is ""
		wantErr string // a prefix of the error reply expected instead
	}{
		{"DEL", "DEL", []int{0, 1, 2}, nkeys, ""},
		{"UNLINK", "UNLINK", []int{0, 1, 2}, nkeys, ""},
		{"EXISTS needing the paused node", "EXISTS", []int{0, 2}, 0, "ERR no majority"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := start(t)
			// No retry and no read timeout short of the test's: the time
			// taken is what is measured.
			c := redis.NewClient(&redis.Options{Addr: e.addr, MaxRetries: -1, ReadTimeout: 30 * time.Second})
			defer c.Close()
			ctx := lockclient.CtxFor(t, 60*time.Second)
			args := []any{tc.cmd}
			for i := range nkeys {
				key := fmt.Sprintf("lock:p%d", i)
				for _, n := range tc.onNodes {
					if err := e.direct[n].Set(ctx, keyPrefix+"lock:"+key, "tok", 30*time.Second).Err(); err != nil {
						t.Fatal(err)
					}
				}
				args = append(args, key)
			}
			e.nodes[2].Pause()
			defer e.nodes[2].Resume()
			begin := time.Now()
			v, err := c.Do(ctx, args...).Result()
			took := time.Since(begin)
			e.nodes[2].Resume()
			if tc.wantErr != "" {
				if err == nil || !strings.HasPrefix(err.Error(), tc.wantErr) {
					t.Errorf("%s of %d keys = %v, %v; want an error %q…", tc.cmd, nkeys, v, err, tc.wantErr)
				}
			} else if n, ok := v.(int64); err != nil || !ok || n != tc.want {
				t.Errorf("%s of %d keys = %v, %v; want %d", tc.cmd, nkeys, v, err, tc.want)
			}
			// One node timeout (1 s) and some slack for a loaded machine;
			// one timeout per key would be 6 s.
			if took > 3*time.Second {
				t.Errorf("%s of %d keys with a node paused took %v; want about one node timeout (1 s), not one per key", tc.cmd, nkeys, took.Round(time.Millisecond))
			}
			t.Logf("%s of %d keys with a node paused: %v", tc.cmd, nkeys, took.Round(time.Millisecond))
		})
	}
}
