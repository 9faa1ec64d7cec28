package redis

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"

	goredis "github.com/redis/go-redis/v9"

	"github.com/lockproxy/lockproxy/test/harness"
)

// BenchmarkReleaseScript measures what the release script costs a real
// redis-server per release, for a single write hold (the common UNLOCK),
// with the releases in calls of 1, 10 and 64 as a batching writer sends
// them. The figure is the node's own time inside EVALSHA (INFO
// commandstats), so the client's cost and the round trips are not in it;
// it is wall time on the node, so a loaded host inflates it.
func BenchmarkReleaseScript(b *testing.B) {
	harness.RequireBinary(b, "redis-server", "redis-server")
	r := harness.StartRedis(b, harness.RedisOptions{})
	c := r.Client(b)
	ctx := context.Background()
	if err := c.ScriptLoad(ctx, scriptRelease.src).Err(); err != nil {
		b.Fatal(err)
	}
	const tok = "0123456789abcdef0123456789abcdef"
	for _, per := range []int{1, 10, 64} {
		b.Run(fmt.Sprintf("per-call=%d", per), func(b *testing.B) {
			if err := c.ConfigResetStat(ctx).Err(); err != nil {
				b.Fatal(err)
			}
			keys := make([]string, 0, 5*per)
			args := make([]any, 0, 4*per)
			released := 0
			for released < b.N {
				keys, args = keys[:0], args[:0]
				p := c.Pipeline()
				for i := range per {
					k := "lp:lock:k" + strconv.Itoa(i)
					p.Set(ctx, k, tok, 0)
					p.Set(ctx, "lp:lockf:k"+strconv.Itoa(i), "12345,"+tok, 0)
					keys = append(keys, k, "lp:lockf:k"+strconv.Itoa(i), "lp:lockm:k"+strconv.Itoa(i), "lp:lockr:k", "lp:lockrh:k")
					args = append(args, tok, "lp:released:k", readMarker, "")
				}
				rel := p.EvalSha(ctx, scriptRelease.sha, keys, args...)
				if _, err := p.Exec(ctx); err != nil {
					b.Fatal(err)
				}
				if got, err := rel.Int64Slice(); err != nil || len(got) != per || got[0] != 1 {
					b.Fatalf("release answers %v, %v; want %d ones", got, err, per)
				}
				released += per
			}
			b.ReportMetric(nodeMicros(b, c, "evalsha")/float64(released), "node-us/release")
			b.ReportMetric(0, "ns/op") // the client's time is not the figure
		})
	}
}

// nodeMicros is the node's total time in cmd since the last CONFIG
// RESETSTAT, from INFO commandstats.
func nodeMicros(b *testing.B, c *goredis.Client, cmd string) float64 {
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_"+cmd+":")
		if !ok {
			continue
		}
		for _, f := range strings.Split(rest, ",") {
			if v, ok := strings.CutPrefix(f, "usec="); ok {
				us, err := strconv.ParseFloat(v, 64)
				if err != nil {
					b.Fatal(err)
				}
				return us
			}
		}
	}
	b.Fatalf("no cmdstat_%s in INFO commandstats", cmd)
	return 0
}
