package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/test/harness"
	"github.com/lockproxy/lockproxy/test/lockclient"
)

// TestDevBannerWithNodes: README's `--dev` starts "three embedded
// in-process nodes when no nodes are given". Given --nodes, lockproxy
// serves from those nodes, so neither its banner nor INFO's
// lockproxy_dev_mode may tell the user that the locks come from three
// embedded in-process nodes (throwaway locks, where they are real); the
// banner names the nodes instead. --dev alone still claims them.
func TestDevBannerWithNodes(t *testing.T) {
	cl := startCluster(t, 3)
	nodes := strings.Join(cl.addrs(), ",")
	bin := harness.BuildLockproxy(t)
	for _, tc := range []struct {
		name      string
		args      []string
		banner    string // in the banner
		notBanner string // not in the output
		devMode   string // INFO's lockproxy_dev_mode
	}{
		{"--dev --nodes", []string{"--nodes", nodes}, "--dev: lock nodes " + nodes, "three embedded in-process lock nodes", "0"},
		{"--dev", nil, "three embedded in-process lock nodes", "--dev: lock nodes", "1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr := fmt.Sprintf("127.0.0.1:%d", harness.FreePort(t))
			p := harness.StartProc(t, bin, append([]string{"--dev", "--listen", addr, "--admin", ""}, tc.args...)...)
			if err := harness.WaitTCP(addr, 15*time.Second); err != nil {
				t.Fatalf("lockproxy did not listen: %v\n%s", err, p.Output())
			}
			c := lc.NewClient(t, addr, 2)
			key := "banner-" + lockclient.RandID()
			g := lc.MustLock(t, c, key, "PX", 10000)
			if _, onNodes := cl.lockValue(t, 0, key); onNodes != (tc.args != nil) {
				t.Fatalf("lock on the --nodes given: %v; test premise broken", onNodes)
			}
			lc.Unlock(t, c, key, g.Token)
			info, err := c.Info(lockclient.CtxFor(t, 5*time.Second), "lockproxy").Result()
			if err != nil {
				t.Fatalf("INFO lockproxy: %v", err)
			}
			if want := "lockproxy_dev_mode:" + tc.devMode; !strings.Contains(info, want) {
				t.Errorf("INFO lacks %q:\n%s", want, info)
			}
			var out string
			for i := 0; i < 50; i++ {
				if out = p.Output(); strings.Contains(out, "redis-cli -p") {
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
			if !strings.Contains(out, tc.banner) {
				t.Errorf("lockproxy --dev %s: banner lacks %q:\n%s", strings.Join(tc.args, " "), tc.banner, out)
			}
			if strings.Contains(out, tc.notBanner) {
				t.Errorf("lockproxy --dev %s: output has %q:\n%s", strings.Join(tc.args, " "), tc.notBanner, out)
			}
		})
	}
}
