package redis

import (
	"errors"
	"testing"
)

// replyErr is an error reply as go-redis gives one (goredis.Error).
type replyErr string

func (e replyErr) Error() string { return string(e) }
func (replyErr) RedisError()     {}

// TestNodeReplyNotNowIsNoAnswer: an error reply with which a node refuses
// a command it did not run (BUSY, LOADING, READONLY, a cluster redirect)
// is a node that did not answer, not a reply to agree on and hand to the
// client, which acts on those prefixes; other error replies are values.
func TestNodeReplyNotNowIsNoAnswer(t *testing.T) {
	for _, tc := range []struct {
		err     error
		noReply bool
	}{
		{replyErr("BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE."), true},
		{replyErr("LOADING Redis is loading the dataset in memory"), true},
		{replyErr("READONLY You can't write against a read only replica."), true},
		{replyErr("READONLY You can't write against a read only replica. script: 1f0a, on @user_script:1."), true},
		{replyErr("TRYAGAIN Multiple keys request during rehashing of slot"), true},
		{replyErr("MOVED 3999 127.0.0.1:6381"), true},
		{replyErr("ASK 3999 127.0.0.1:6381"), true},
		{replyErr("MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'."), true},
		{replyErr("CLUSTERDOWN The cluster is down"), true},
		{replyErr("BUSYKEY Target key name already exists."), false},
		{replyErr("WRONGTYPE Operation against a key holding the wrong kind of value"), false},
		{replyErr("ERR Error running script"), false},
		{replyErr("NOSCRIPT No matching script."), false},
		{errors.New("dial tcp: connection refused"), true},
	} {
		r := nodeReply(nil, tc.err)
		if got := r.Err != nil; got != tc.noReply {
			t.Errorf("nodeReply(%q) = %+v; want no answer (Err) %v", tc.err, r, tc.noReply)
		}
	}
}
