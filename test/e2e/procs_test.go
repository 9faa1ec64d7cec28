package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/test/harness"
	"github.com/lockproxy/lockproxy/test/lockclient"
)

// TestProcs: how many threads run Go code (GOMAXPROCS, exported by the Go
// collector as go_sched_gomaxprocs_threads, and in INFO lockproxy as
// lockproxy_procs). By default (procs: auto) an
// idle lockproxy runs one; --procs fixes the number, and so does a
// GOMAXPROCS the environment sets, which lockproxy then leaves alone.
// When auto gives more Ps under load is package procs' TestPolicyNext and
// TestControllerRun: a real load of most of a core on lockproxy alone is
// more than a shared 2-core test machine can be relied on to produce.
func TestProcs(t *testing.T) {
	t.Parallel()
	cl := startCluster(t, 3)
	bin := harness.BuildLockproxy(t)
	for _, tc := range []struct {
		name string
		args []string
		env  []string
		want string
	}{
		{"auto starts with one", nil, nil, "1"},
		{"auto in the environment", nil, []string{"LOCKPROXY_PROCS=auto"}, "1"},
		{"fixed by the flag", []string{"--procs", "3"}, nil, "3"},
		{"fixed by the environment", nil, []string{"LOCKPROXY_PROCS=2"}, "2"},
		{"GOMAXPROCS is left as set", nil, []string{"GOMAXPROCS=3"}, "3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := &instance{
				addr:  fmt.Sprintf("127.0.0.1:%d", harness.FreePort(t)),
				admin: fmt.Sprintf("127.0.0.1:%d", harness.FreePort(t)),
			}
			args := append([]string{"--listen", in.addr, "--admin", in.admin, "--nodes", strings.Join(cl.addrs(), ",")}, tc.args...)
			cmd := exec.Command(bin, args...)
			cmd.Env = tc.env
			for _, kv := range os.Environ() {
				// The runner's own settings would decide in its place.
				if !strings.HasPrefix(kv, "GOMAXPROCS=") && !strings.HasPrefix(kv, "LOCKPROXY_") {
					cmd.Env = append(cmd.Env, kv)
				}
			}
			in.proc = harness.StartCmd(t, cmd)
			if err := harness.WaitTCP(in.admin, 15*time.Second); err != nil {
				t.Fatalf("lockproxy %v did not listen on admin %s: %v\n%s", args, in.admin, err, in.proc.Output())
			}
			// Idle for several of the controller's intervals: auto must
			// not have grown.
			time.Sleep(500 * time.Millisecond)
			if got := metricValue(t, in, "go_sched_gomaxprocs_threads"); got != tc.want {
				t.Fatalf("go_sched_gomaxprocs_threads = %q; want %s\n%s", got, tc.want, in.proc.Output())
			}
			// INFO says the same.
			info, err := lc.NewClient(t, in.addr, 2).Info(lockclient.CtxFor(t, 10*time.Second), "lockproxy").Result()
			if err != nil {
				t.Fatalf("INFO lockproxy: %v", err)
			}
			if want := "lockproxy_procs:" + tc.want + "\r\n"; !strings.Contains(info, want) {
				t.Fatalf("INFO lockproxy lacks %q:\n%s", want, info)
			}
		})
	}
}
