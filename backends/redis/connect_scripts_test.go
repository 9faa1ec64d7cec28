package redis

import (
	"testing"
	"time"
)

// TestConnectionLoadsBatchScripts: a writer's connection loads the scripts
// batches send by SHA when it is made. Before, a batch met NOSCRIPT on a
// node's first use of a script and sent that command again after the
// batch's others: a read acquire so re-sent ran after the release of the
// same key that had come in the same batch, and its hold stayed until its
// lease ended (TestLateReadAcquireRolledBack's warm-up, 1 run in 10, found
// the read hold still on a node 2 s after its UNLOCK).
func TestConnectionLoadsBatchScripts(t *testing.T) {
	_, r := nodeOnRedis(t) // its writer connects at once
	c := r.Client(t)
	ctx := ctxTimeout(t, 10*time.Second)
	shas := make([]string, len(batchScripts))
	for i, s := range batchScripts {
		shas[i] = s.sha
	}
	for i := 0; ; i++ {
		loaded := 0
		for _, ok := range c.ScriptExists(ctx, shas...).Val() {
			if ok {
				loaded++
			}
		}
		if loaded == len(shas) {
			return
		}
		if i == 200 {
			t.Fatalf("%d of the %d batch scripts loaded on the node 2 s after the writer started; want all", loaded, len(shas))
		}
		time.Sleep(10 * time.Millisecond)
	}
}
