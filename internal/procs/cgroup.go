package procs

import (
	"bufio"
	"bytes"
	"math"
	"os"
	"path"
	"strconv"
	"strings"
)

// cgroupFS is where cpuQuota looks: the process's cgroup membership and
// the cgroup file systems. Tests point it at a directory of their own.
type cgroupFS struct {
	procSelfCgroup string // /proc/self/cgroup
	root           string // /sys/fs/cgroup
}

var hostCgroups = cgroupFS{procSelfCgroup: "/proc/self/cgroup", root: "/sys/fs/cgroup"}

// cpuQuota returns the CPU bandwidth limit of the process's cgroup, in
// cores (a quota of 150 ms per 100 ms period is 1.5), or +Inf when there
// is none or it cannot be read. With cgroup v2 the lowest limit on the
// way up to the root counts, as the kernel enforces every one of them.
func (fs cgroupFS) cpuQuota() float64 {
	data, err := os.ReadFile(fs.procSelfCgroup)
	if err != nil {
		return math.Inf(1)
	}
	limit := math.Inf(1)
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		// "hierarchy-ID:controllers:path"; v2 is "0::path".
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		p := path.Clean("/" + parts[2])
		switch {
		case parts[0] == "0" && parts[1] == "":
			limit = min(limit, fs.v2Quota(p))
		case hasController(parts[1], "cpu"):
			limit = min(limit, fs.v1Quota(p))
		}
	}
	return limit
}

// v2Quota walks from the cgroup at p up to the root, reading cpu.max at
// each level. Inside a container with its own cgroup namespace p is "/"
// and the root is the container's cgroup.
func (fs cgroupFS) v2Quota(p string) float64 {
	limit := math.Inf(1)
	for {
		if b, err := os.ReadFile(path.Join(fs.root, p, "cpu.max")); err == nil {
			// "max 100000" or "150000 100000"
			f := strings.Fields(string(b))
			if len(f) == 2 && f[0] != "max" {
				limit = min(limit, ratio(f[0], f[1]))
			}
		}
		if p == "/" {
			return limit
		}
		p = path.Dir(p)
	}
}

// v1Quota reads cpu.cfs_quota_us and cpu.cfs_period_us of the cgroup at p
// under the usual mount points of the cpu controller, then at their roots
// (a container sees its own cgroup there).
func (fs cgroupFS) v1Quota(p string) float64 {
	for _, mount := range []string{"cpu,cpuacct", "cpu", "cpuacct,cpu"} {
		for _, dir := range []string{path.Join(fs.root, mount, p), path.Join(fs.root, mount)} {
			q, err1 := os.ReadFile(path.Join(dir, "cpu.cfs_quota_us"))
			per, err2 := os.ReadFile(path.Join(dir, "cpu.cfs_period_us"))
			if err1 != nil || err2 != nil {
				continue
			}
			qs := strings.TrimSpace(string(q))
			if strings.HasPrefix(qs, "-") { // -1: no limit
				return math.Inf(1)
			}
			return ratio(qs, strings.TrimSpace(string(per)))
		}
	}
	return math.Inf(1)
}

func hasController(list, name string) bool {
	for _, c := range strings.Split(list, ",") {
		if c == name {
			return true
		}
	}
	return false
}

// ratio is quota/period in cores, +Inf when either does not parse or the
// period is not positive.
func ratio(quota, period string) float64 {
	q, err1 := strconv.ParseFloat(quota, 64)
	p, err2 := strconv.ParseFloat(period, 64)
	if err1 != nil || err2 != nil || p <= 0 || q <= 0 {
		return math.Inf(1)
	}
	return q / p
}
