package procs

import (
	"math"
	"os"
	"path/filepath"
	"testing"
)

func TestCPUQuota(t *testing.T) {
	inf := math.Inf(1)
	tests := []struct {
		name   string
		cgroup string            // /proc/self/cgroup
		files  map[string]string // under the cgroup root
		want   float64
	}{
		{"v2 no limit", "0::/system.slice/lockproxy.service\n", map[string]string{
			"system.slice/lockproxy.service/cpu.max": "max 100000\n",
		}, inf},
		{"v2 limit", "0::/system.slice/lockproxy.service\n", map[string]string{
			"system.slice/lockproxy.service/cpu.max": "150000 100000\n",
		}, 1.5},
		{"v2 a parent's lower limit counts", "0::/kubepods/pod1/c1\n", map[string]string{
			"kubepods/pod1/c1/cpu.max": "400000 100000\n",
			"kubepods/pod1/cpu.max":    "50000 100000\n",
			"kubepods/cpu.max":         "max 100000\n",
		}, 0.5},
		{"v2 in a cgroup namespace", "0::/\n", map[string]string{
			"cpu.max": "200000 100000\n",
		}, 2},
		{"v2 no cpu.max files", "0::/a/b\n", nil, inf},
		{"v2 garbage", "0::/a\n", map[string]string{"a/cpu.max": "lots\n"}, inf},
		{"v2 zero period", "0::/a\n", map[string]string{"a/cpu.max": "100000 0\n"}, inf},
		{"v1 limit", "12:memory:/docker/x\n4:cpu,cpuacct:/docker/x\n", map[string]string{
			"cpu,cpuacct/docker/x/cpu.cfs_quota_us":  "250000\n",
			"cpu,cpuacct/docker/x/cpu.cfs_period_us": "100000\n",
		}, 2.5},
		{"v1 no limit", "4:cpu,cpuacct:/docker/x\n", map[string]string{
			"cpu,cpuacct/docker/x/cpu.cfs_quota_us":  "-1\n",
			"cpu,cpuacct/docker/x/cpu.cfs_period_us": "100000\n",
		}, inf},
		{"v1 seen from inside the container", "4:cpu,cpuacct:/docker/x\n", map[string]string{
			"cpu,cpuacct/cpu.cfs_quota_us":  "100000\n",
			"cpu,cpuacct/cpu.cfs_period_us": "100000\n",
		}, 1},
		{"v1 cpu mounted alone", "3:cpu:/x\n", map[string]string{
			"cpu/x/cpu.cfs_quota_us":  "50000\n",
			"cpu/x/cpu.cfs_period_us": "100000\n",
		}, 0.5},
		{"v1 cpuset is not cpu", "5:cpuset:/x\n", map[string]string{
			"cpuset/x/cpu.cfs_quota_us":  "50000\n",
			"cpuset/x/cpu.cfs_period_us": "100000\n",
		}, inf},
		{"malformed membership lines", "garbage\n\n::\n", nil, inf},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			root := filepath.Join(dir, "sys")
			for name, body := range tt.files {
				p := filepath.Join(root, name)
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			self := filepath.Join(dir, "cgroup")
			if err := os.WriteFile(self, []byte(tt.cgroup), 0o644); err != nil {
				t.Fatal(err)
			}
			fs := cgroupFS{procSelfCgroup: self, root: root}
			if got := fs.cpuQuota(); got != tt.want {
				t.Fatalf("cpuQuota = %v, want %v", got, tt.want)
			}
		})
	}

	// No /proc/self/cgroup (not Linux, or a sandbox): no limit.
	if got := (cgroupFS{procSelfCgroup: filepath.Join(t.TempDir(), "none")}).cpuQuota(); got != inf {
		t.Fatalf("cpuQuota without /proc/self/cgroup = %v, want +Inf", got)
	}
	// This machine's own files parse to something positive.
	if got := hostCgroups.cpuQuota(); !(got > 0) {
		t.Fatalf("cpuQuota of this process = %v", got)
	}
}
