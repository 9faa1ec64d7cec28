// Package zookeeper serves lock commands from a ZooKeeper ensemble: each
// lock is an ephemeral sequential znode under <root>/<encoded key>, the
// lowest holds, and each waiter watches only the node it waits for (a
// reader: the gate of the writer it waits for, which exists while that
// writer has write holds and never changes), so waiters are served in
// arrival order across every lockproxy instance, a release wakes one
// waiter (no herd), and a renewal or reentry of a holder wakes none (a
// writer right behind it sets its watch again, one request).
//
// It owns the lock recipe (exclusive and read-write), the znode naming and
// data, lease enforcement (ZooKeeper has no TTL on ephemeral nodes, so the
// instance that created a node deletes it when its lease ends unless it was
// renewed), and the reaction to session events. It knows nothing of RESP or
// of the command layer.
//
// Caveats: a lock lives in the ZooKeeper session of the instance that
// created it, so validity is capped by the session's horizon, a part of
// the session timeout (a session ends only after that long without contact
// reaching the leader, and a follower forwards contact late; see
// sessionHorizon), and closing the backend drops
// every lock it holds. go-zookeeper's calls take no context; each runs on a
// goroutine that ends when its connection answers or closes, and the
// caller returns when its context is done.
package zookeeper
