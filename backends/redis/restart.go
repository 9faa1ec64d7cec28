package redis

import (
	"context"
	"errors"
	"strconv"

	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

// quarantinedError is the answer of a node that restarted and may not vote
// yet. It is given without any network I/O.
type quarantinedError struct{}

func (quarantinedError) Error() string  { return "redis: node quarantined after a restart" }
func (quarantinedError) Reason() string { return "quarantined" }

var errQuarantined error = quarantinedError{}

// clockError is the answer of a node whose clock rate error is out of
// bound (redlock.max_clock_rate_error). It is given without any network
// I/O.
type clockError struct{}

func (clockError) Error() string  { return "redis: node's clock rate out of bound" }
func (clockError) Reason() string { return "clock" }

var errClock error = clockError{}

// replicaError is the answer of a node that is a replica (INFO
// replication role:slave): its lock writes fail with READONLY or are
// replaced by its master's data. It is given without any network I/O.
type replicaError struct{}

func (replicaError) Error() string  { return "redis: node is a replica" }
func (replicaError) Reason() string { return "replica" }

var errReplica error = replicaError{}

// isServerError reports an error reply from the server (as opposed to a
// transport failure): the node is there, it refused the command.
func isServerError(err error) bool {
	var re goredis.Error
	return errors.As(err, &re) && !errors.Is(err, errQuarantined) && !errors.Is(err, errClock) && !errors.Is(err, errReplica)
}

// onConnect is go-redis's hook on every new connection to the node. It
// runs INFO server on that connection before anything else does, so a
// restart is known before any command of ours reaches the restarted server:
// the writer then discards the answers of the batch that found it (see
// exec), and no command on the new connection counts as the vote of a node
// that forgot its locks. It holds no lock while it waits.
func (n *Node) onConnect(ctx context.Context, cn *goredis.Conn) error {
	info, err := cn.Info(ctx, "server").Result()
	if err != nil {
		if isServerError(err) {
			n.noInfo(err)
			return nil
		}
		return err
	}
	n.learn(parseServerInfo(info))
	return nil
}

// check reads the node's INFO server (a periodic check) and, once, its
// persistence settings. A TIME rides in the same pipeline, so measuring
// the node's clock rate costs no round trip of its own, and so does INFO
// replication, for the node's role (a separate command: Redis before 7
// takes one INFO section at a time).
func (n *Node) check(ctx context.Context) {
	pipe := n.client.Pipeline()
	infoCmd := pipe.Info(ctx, "server")
	replCmd := pipe.Info(ctx, "replication")
	timeCmd := pipe.Time(ctx)
	// The data epoch too, as the writers' batches read it: a node
	// flushed or synced while no batch runs is quarantined now.
	epochCmd := pipe.Get(ctx, n.epochKey)
	gen, seq := n.health.gen.Load(), n.health.epochSince()
	sent := n.health.now()
	_, _ = pipe.Exec(ctx) // per-command errors are read from the commands
	received := n.health.now()
	info, err := infoCmd.Result()
	// INFO first: a restart it reveals resets the samples before this
	// one, which comes from the new server, is added.
	defer n.sampleTime(sent, received, timeCmd)
	switch {
	case err == nil:
		n.learn(parseServerInfo(info))
		// After the restart detector: a node that restarted and is a
		// master again is quarantined either way.
		n.learnRole(replCmd)
		if v, err := epochCmd.Result(); err == nil || errors.Is(err, goredis.Nil) {
			if n.health.checkEpoch(v, err == nil, gen, seq) {
				n.epochQuarantined()
			}
		}
		n.checkPersistence(ctx)
	case errors.Is(err, errQuarantined):
		// onConnect saw the restart on a new connection.
	case isServerError(err):
		n.health.setDown(false)
		n.noInfo(err)
		n.learnRole(replCmd)
	default:
		n.health.setDown(true)
	}
}

// learn feeds an INFO answer to the restart detector and reports whether it
// shows a restart.
func (n *Node) learn(si serverInfo) bool {
	if !n.health.observe(si) {
		return false
	}
	if n.restarts != nil {
		n.restarts.Inc()
	}
	n.clock.reset()
	if n.health.period > 0 {
		if n.quarantined != nil {
			n.quarantined.Set(1)
		}
		n.log.Warn("redis node restarted: quarantined until the locks it may have forgotten have expired",
			zap.String("run_id", si.runID), zap.Duration("quarantine", n.health.period))
	} else {
		n.log.Warn("redis node restarted; redlock.quarantine is off, so it votes at once and locks it forgot may be granted twice",
			zap.String("run_id", si.runID))
	}
	return true
}

// learnEpoch feeds the node's data epoch, as a connection read it, to
// the detector (see health.observeEpoch) and reports whether it changed:
// the node is then quarantined as after a restart.
func (n *Node) learnEpoch(v string, ok bool) bool {
	if !n.health.observeEpoch(v, ok) {
		return false
	}
	n.epochQuarantined()
	return true
}

// epochQuarantined reports a quarantine for a data epoch change.
func (n *Node) epochQuarantined() {
	if n.health.period > 0 {
		if n.quarantined != nil {
			n.quarantined.Set(1)
		}
		n.log.Warn("redis node's data was replaced (its epoch key changed or vanished: a full sync from another master, "+
			"FLUSHALL, a restart the connection did not see): quarantined as after a restart",
			zap.Duration("quarantine", n.health.period))
	} else {
		n.log.Warn("redis node's data was replaced (its epoch key changed or vanished); redlock.quarantine is off, " +
			"so it votes at once and locks its data no longer holds may be granted twice")
	}
}

// learnRole feeds the answer to INFO replication to the role detector.
func (n *Node) learnRole(cmd *goredis.StringCmd) {
	info, err := cmd.Result()
	var ri replInfo
	if err == nil {
		ri = parseReplInfo(info)
	}
	if ri.role == "" {
		if err == nil || isServerError(err) {
			// Denied by an ACL, or a server without roles.
			n.health.noRoleLog.Do(func() {
				reason := "no role in the answer"
				if err != nil {
					reason = reasonOf(err)
				}
				n.log.Warn("cannot read the role from INFO replication on the redis node: "+
					"if it is made a replica it is not taken out of quorums, nor quarantined once a master again",
					zap.String("reason", reason))
			})
		}
		return
	}
	switch n.health.observeRole(ri) {
	case roleReplica:
		n.log.Warn("redis node is a replica: it no longer votes, as its lock writes fail (READONLY) "+
			"or are replaced by its master's data; once a master again it is quarantined, then votes",
			zap.String("master", ri.master))
	case rolePromoted:
		if n.health.period > 0 {
			if n.quarantined != nil {
				n.quarantined.Set(1)
			}
			n.log.Warn("redis node is a master again after being a replica: its data may be another server's, "+
				"not the locks it granted, so it is quarantined as after a restart",
				zap.Duration("quarantine", n.health.period))
		} else {
			n.log.Warn("redis node is a master again after being a replica; redlock.quarantine is off, so it votes " +
				"at once and locks its data no longer holds may be granted twice")
		}
	}
}

// noInfo says once that the node's restarts cannot be seen.
func (n *Node) noInfo(err error) {
	n.noInfoOnce.Do(func() {
		n.log.Warn("cannot read INFO server from the redis node: its restarts go unnoticed and it is never quarantined",
			zap.String("reason", reasonOf(err)))
	})
}

// noEpoch says once that the node's data epoch cannot be read: a node
// whose data is replaced without a restart (REPLICAOF, FLUSHALL) votes on
// the writers' connections until a check sees it, if any can.
func (n *Node) noEpoch(err error) {
	n.noEpochOnce.Do(func() {
		n.log.Warn("cannot read or create the data epoch key on the redis node: a FLUSHALL or a full sync there goes unnoticed until a check",
			zap.String("reason", reasonOf(err)))
	})
}

// noClientID warns once that the writers' connections cannot learn their
// client ids (CLIENT ID refused, an ACL): a connection dropped with
// acquires unanswered cannot be killed from the next one, so an acquire
// still on its way may land after its roll-back; a roll-back that could
// not be sent is still owed to the next connection (see owed).
func (n *Node) noClientID(err error) {
	n.noClientIDOnce.Do(func() {
		n.log.Warn("cannot read CLIENT ID on the redis node: an acquire that timed out there and lands after its roll-back keeps its key until its TTL",
			zap.String("reason", reasonOf(err)))
	})
}

// checkPersistence warns once when the node would lose acknowledged writes
// in a crash: without appendonly yes and appendfsync always, only the
// quarantine keeps a restarted node from granting a lock twice.
func (n *Node) checkPersistence(ctx context.Context) {
	if n.persistChecked.Load() {
		return
	}
	vals := map[string]string{}
	for _, p := range []string{"appendonly", "appendfsync"} {
		m, err := n.client.ConfigGet(ctx, p).Result()
		if err != nil {
			if !isServerError(err) {
				return // try again at the next check
			}
			n.persistChecked.Store(true)
			n.configDeniedLog.Do(func() {
				n.log.Debug("CONFIG GET is denied on the redis node; cannot check appendfsync",
					zap.String("reason", reasonOf(err)))
			})
			return
		}
		vals[p] = m[p]
	}
	n.persistChecked.Store(true)
	if vals["appendonly"] != "yes" || vals["appendfsync"] != "always" {
		n.log.Warn("redis node runs without appendonly yes and appendfsync always: after a crash it forgets "+
			"the locks it granted, and only the restart quarantine keeps them from being granted twice",
			zap.String("appendonly", vals["appendonly"]), zap.String("appendfsync", vals["appendfsync"]))
	}
}

// reasonOf is the first words of a server error, for logs.
func reasonOf(err error) string {
	s := err.Error()
	if len(s) > 80 {
		s = s[:80]
	}
	return s
}

// readFences returns the node's fence hash (HGETALL).
func (n *Node) readFences(ctx context.Context) (map[string]string, error) {
	return n.client.HGetAll(ctx, n.fenceKey).Result()
}

// seedFences raises each of the node's fence counters to at least the
// given value. It bypasses the quarantine, which it exists to end.
func (n *Node) seedFences(ctx context.Context, fences map[string]uint64) error {
	if len(fences) == 0 {
		return nil
	}
	args := make([]any, 0, 2*len(fences))
	for f, v := range fences {
		args = append(args, f, strconv.FormatUint(v, 10))
	}
	return n.client.Eval(ctx, seedFenceScript, []string{n.fenceKey}, args...).Err()
}

// endQuarantine lets the node vote again once its fences were re-seeded.
func (n *Node) endQuarantine() bool {
	if !n.health.seeded() {
		return false
	}
	if n.quarantined != nil {
		n.quarantined.Set(0)
	}
	n.log.Info("redis node re-seeded after its quarantine (a restart, or a promotion from replica); it votes again")
	return true
}

// State describes the node for INFO: its state (ok, quarantined, replica,
// clock or down),
// the quarantine time left and the restarts seen.
func (n *Node) State() (state string, quarantineLeftMS int64, restarts uint64) {
	st, left, r := n.health.status()
	return st, left.Milliseconds(), r
}

// ClockRateError is the node's estimated clock rate error, |rate − 1|
// against the proxy's monotonic clock; ok is false until there are enough
// samples.
func (n *Node) ClockRateError() (e float64, ok bool) { return n.clock.rateError() }
