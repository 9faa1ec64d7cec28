package redis

import (
	"crypto/sha1"
	"encoding/hex"
)

// An acquire is plain SET NX PX plus HINCRBY (see Node.send); the other
// operations need a compare-and-act, so they are scripts.
//
// Lock keys on a node are plain strings whose value is the holder's token,
// so that a lock taken with LOCK and one taken with SET NX PX look alike.
// Fence counters live in one hash per node, one field per key slot
// (crc16(key) mod 16384): memory on a node stays bounded however many
// distinct keys are ever locked, and two keys only share a counter when
// they share a slot, which costs nothing but a bigger jump in the fence.

// raiseFenceScript: KEYS[1] lock key, KEYS[2] fence hash; ARGV[1] token,
// ARGV[2] slot, ARGV[3] fence. Raises the slot's counter to the fence while
// the token still holds the key (so a later holder, which must acquire after
// this key is gone, reads it). Returns 1 when the token holds the key.
// Fences stay below 2^53, where Lua numbers are exact.
const raiseFenceScript = `
if redis.call('GET', KEYS[1]) == ARGV[1] then
  local cur = tonumber(redis.call('HGET', KEYS[2], ARGV[2]) or '0')
  local want = tonumber(ARGV[3])
  if cur < want then redis.call('HSET', KEYS[2], ARGV[2], ARGV[3]) end
  return 1
end
return 0
`

// releaseScript: KEYS[1] lock key; ARGV[1] token, ARGV[2] release channel.
// Compare-and-delete; a delete is announced on the channel, in the same
// call, so that waiters on every lockproxy instance learn of it without a
// round trip of their own. An expiry is not announced: waiters find it by
// their retry. The announcement is a pcall: a node user whose ACL denies
// the channel still releases, and waiters fall back to their retry.
const releaseScript = `
if redis.call('GET', KEYS[1]) == ARGV[1] then
  local n = redis.call('DEL', KEYS[1])
  redis.pcall('PUBLISH', ARGV[2], '')
  return n
end
return 0
`

// extendScript: KEYS[1] lock key; ARGV[1] token, ARGV[2] ttl ms.
// Compare-and-expire.
const extendScript = `
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
`

// seedFenceScript: KEYS[1] fence hash; ARGV field, value pairs. Raises
// each field to at least its value, in one call, so a counter never goes
// down even if acquires run on the node meanwhile. It re-seeds a node that
// restarted empty from the other nodes' counters (at most 16,384 fields,
// one per slot).
const seedFenceScript = `
for i = 1, #ARGV, 2 do
  local cur = tonumber(redis.call('HGET', KEYS[1], ARGV[i]) or '0')
  if cur < tonumber(ARGV[i + 1]) then redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
end
return 1
`

type script struct {
	src string
	sha string
}

func newScript(src string) script {
	h := sha1.Sum([]byte(src))
	return script{src: src, sha: hex.EncodeToString(h[:])}
}

var (
	scriptRaiseFence = newScript(raiseFenceScript)
	scriptRelease    = newScript(releaseScript)
	scriptExtend     = newScript(extendScript)
)

// slot is Redis Cluster's key slot: crc16 (XMODEM) mod 16384.
func slot(key string) uint16 {
	var crc uint16
	for i := 0; i < len(key); i++ {
		crc = crc<<8 ^ crc16tab[byte(crc>>8)^key[i]]
	}
	return crc & 16383
}

var crc16tab = func() (t [256]uint16) {
	for i := range t {
		c := uint16(i) << 8
		for j := 0; j < 8; j++ {
			if c&0x8000 != 0 {
				c = c<<1 ^ 0x1021
			} else {
				c <<= 1
			}
		}
		t[i] = c
	}
	return t
}()
