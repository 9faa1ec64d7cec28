package commands

import (
	"context"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/lockproxy/lockproxy/test/harness"
)

// TestXreadOptionShapesRelayed: XREAD and XREADGROUP take their options
// in any order, and a stream, group or consumer may be named like an
// option. Each shape Redis accepts is relayed and answered as Redis
// answers it; each that names a stream under the prefix, in any shape, is
// refused.
func TestXreadOptionShapesRelayed(t *testing.T) {
	up := harness.StartRedis(t, harness.RedisOptions{})
	uc := up.Client(t)
	ctx := context.Background()
	for _, s := range []string{"s", "count", "block", "streams", "group", "noack"} {
		if err := uc.XAdd(ctx, &goredis.XAddArgs{Stream: s, ID: "1-1", Values: []string{"f", "v"}}).Err(); err != nil {
			t.Fatal(err)
		}
		if err := uc.XGroupCreate(ctx, s, "streams", "0").Err(); err != nil {
			t.Fatal(err)
		}
	}
	addr := defaultsProxy(t, up, 2)
	for _, cmd := range []string{
		"XREAD COUNT 1 STREAMS s 0",
		"XREAD BLOCK 10 COUNT 1 STREAMS s 0",
		"XREAD COUNT 1 BLOCK 10 STREAMS s 0",
		"XREAD count 1 block 10 streams count block 0 0",
		"XREAD STREAMS streams noack 0 0",
		"XREADGROUP GROUP streams c STREAMS s >",
		"XREADGROUP COUNT 1 GROUP streams streams NOACK STREAMS count >",
		"XREADGROUP NOACK COUNT 1 BLOCK 10 GROUP streams noack STREAMS group >",
		"XREADGROUP GROUP streams c BLOCK 10 STREAMS block streams 0 0",
	} {
		t.Run(cmd, func(t *testing.T) {
			c := dialFrames(t, addr)
			r := c.do(cmd)
			if strings.HasPrefix(r, "-") {
				t.Errorf("%s: %s; want it relayed", cmd, r)
			}
		})
	}
	for _, cmd := range []string{
		"XREAD BLOCK 10 COUNT 1 STREAMS lockproxy:s 0",
		"XREAD COUNT 1 STREAMS s lockproxy:s 0 0",
		"XREADGROUP NOACK GROUP streams c COUNT 1 STREAMS lockproxy:s >",
		"XREADGROUP COUNT 1 BLOCK 10 GROUP g streams STREAMS lockproxy:s >",
	} {
		t.Run(cmd, func(t *testing.T) {
			c := dialFrames(t, addr)
			c.send(cmd)
			r, err := c.read(5 * time.Second)
			if err != nil || !strings.Contains(r, "reserved") {
				t.Errorf("%s: %s, %v; want the reserved-prefix refusal", cmd, r, err)
			}
		})
	}
}
