package redis

import (
	"crypto/sha1"
	"encoding/hex"
)

// Every lock operation but a first write grant is one Lua script, so that
// it is atomic on the node and costs one round trip in the node's
// pipeline (a first grant is a plain SET NX PX and HINCRBY; see
// Node.send). Redis's time inside a script is mostly per call, and the
// release script is the bulk of a node's work per lock: the release of a
// single hold, the common case, runs three calls (MGET, DEL, PUBLISH).
//
// The keys of one lock (client key k, prefix P) on a node:
//
//	P lock:k    string: the write holder's token, or readMarker while
//	            readers hold it; its PX is the lease (for readers, the
//	            longest reader lease). It is a plain string so that a lock
//	            taken with LOCK and one taken with SET NX PX look alike.
//	P lockf:k   string "fence[,extra holds[,r]]" of the current write hold:
//	            its fence, its holds beyond the first (reentrancy), and
//	            "r" when the holder also holds it for reading (downgrade)
//	P lockr:k   sorted set: reader tokens scored by lease end (node ms)
//	P lockrh:k  hash: reader token -> holds
//	P lockw:k   string: a writer waits (PX); new readers queue behind it
//
// Meta keys carry the same expiry as the lock key or are cleaned up by
// the next operation that finds them stale, so a lock key that expired or
// was deleted by hand leaves nothing that changes a later grant.
//
// Fence counters live in one hash per node, one field per key slot
// (crc16(key) mod 16384): memory on a node stays bounded however many
// distinct keys are ever locked, and two keys only share a counter when
// they share a slot, which costs nothing but a bigger jump in the fence.
// Fences stay below 2^53, where Lua numbers are exact.

// readMarker is the value of a lock key held by readers. TOKEN refuses it.
const readMarker = "\x00lockproxy:read"

// Key order shared by the lock scripts.
const (
	keyLock = iota
	keyMeta
	keyReaders
	keyReaderHolds
	keyWriterWaits
	keyFenceHash
	numLockKeys
)

// luaMeta parses and formats the lockf value.
const luaMeta = `
local function meta(s)
  local f, h, r = string.match(s or '0', '^(%d+),?(%d*),?(%a*)$')
  return tonumber(f) or 0, tonumber(h) or 0, r or ''
end
local function fmtmeta(f, h, r)
  if h == 0 and r == '' then return tostring(f) end
  return f .. ',' .. h .. ',' .. r
end
`

// luaNow and luaPrune are shared script parts: the node's time in ms, and
// dropping readers whose lease ended.
const luaNow = `
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
`

const luaPrune = `
local gone = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now)
if #gone > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
  for _, r in ipairs(gone) do redis.call('HDEL', KEYS[4], r) end
end
`

// acquireScript follows a failed SET NX PX (see Node.send), or runs alone.
// KEYS the lock keys; ARGV[1] token, ARGV[2] ttl ms,
// ARGV[3] slot, ARGV[4] writer-wait ms or 0, ARGV[5] readMarker, ARGV[6]
// 1 to refuse reentry (SET NX's rule) or 0.
// Returns {fence, holds} when granted, or {stored fence or 0, holds, slot
// counter} for a reentrant grant (the token already holds it: one more
// hold, the lease reset), 0
// when held by another, -1 when the token holds it for reading (upgrade).
// A refused writer that will wait marks itself on the node (lockw) so new
// readers stop joining.
const acquireScript = luaMeta + `
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local f = redis.call('HINCRBY', KEYS[6], ARGV[3], 1)
  redis.call('SET', KEYS[2], f, 'PX', ARGV[2])
  if ARGV[4] ~= '0' then redis.call('DEL', KEYS[5]) end
  return {f, 1}
end
local v = redis.call('GET', KEYS[1])
if v == ARGV[1] and ARGV[6] ~= '1' then
  local f, h, r = meta(redis.call('GET', KEYS[2]))
  h = h + 1
  redis.call('SET', KEYS[2], fmtmeta(f, h, r), 'PX', ARGV[2])
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  -- f is 0 when the hold's fence was never stored here (the grant's
  -- answer from this node was lost): the quorum takes the other nodes'
  -- fence, or this slot counter, which is at least the hold's fence.
  return {f, h + 1, tonumber(redis.call('HGET', KEYS[6], ARGV[3]) or '0')}
end
if ARGV[4] ~= '0' then redis.call('SET', KEYS[5], '1', 'PX', ARGV[4]) end
if v == ARGV[5] then
  local s = redis.call('ZSCORE', KEYS[3], ARGV[1])
  if s then` + luaNow + `
    if tonumber(s) > now then return -1 end
  end
end
return 0
`

// readScript: KEYS the lock keys; ARGV[1] token, ARGV[2] ttl ms, ARGV[3]
// slot, ARGV[4] readMarker. Returns {fence, holds} when granted, 0 when a
// writer holds the key or waits for it. Each reader's lease is its own
// score; the lock key lives as long as the longest. The write holder may
// take a read hold too (a downgrade, flagged in its lockf). The fence is
// the slot's counter (for a downgrade, the write hold's): at least that of
// every earlier write.
const readScript = luaMeta + luaNow + `
local v = redis.call('GET', KEYS[1])
if v and v ~= ARGV[4] and v ~= ARGV[1] then return 0 end
if not v then
  redis.call('DEL', KEYS[3], KEYS[4])
else` + luaPrune + `
end
local mine = redis.call('ZSCORE', KEYS[3], ARGV[1])
if not mine and v ~= ARGV[1] and redis.call('EXISTS', KEYS[5]) == 1 then return 0 end
redis.call('ZADD', KEYS[3], now + tonumber(ARGV[2]), ARGV[1])
local h = redis.call('HINCRBY', KEYS[4], ARGV[1], 1)
local keep = tonumber(redis.call('ZRANGE', KEYS[3], -1, -1, 'WITHSCORES')[2]) - now
local fence = tonumber(redis.call('HGET', KEYS[6], ARGV[3]) or '0')
if v == ARGV[1] then
  keep = math.max(keep, redis.call('PTTL', KEYS[1]))
  local f, wh, r = meta(redis.call('GET', KEYS[2]))
  fence = f
  if r ~= 'r' then redis.call('SET', KEYS[2], fmtmeta(f, wh, 'r'), 'KEEPTTL') end
else
  redis.call('SET', KEYS[1], ARGV[4], 'PX', keep)
end
redis.call('PEXPIRE', KEYS[3], keep)
redis.call('PEXPIRE', KEYS[4], keep)
return {fence, h}
`

// raiseFenceScript: KEYS[1] lock key, KEYS[2] fence hash, KEYS[3] lockf;
// ARGV[1] token, ARGV[2] slot, ARGV[3] fence. Raises the slot's counter to
// the fence while the token still holds the key (so a later holder, which
// must acquire after this key is gone, reads it), and stores the grant's
// fence with the hold, expiring with it, for reentrant grants to return.
// Returns 1 when the token holds the key.
const raiseFenceScript = luaMeta + `
if redis.call('GET', KEYS[1]) == ARGV[1] then
  local cur = tonumber(redis.call('HGET', KEYS[2], ARGV[2]) or '0')
  local want = tonumber(ARGV[3])
  if cur < want then redis.call('HSET', KEYS[2], ARGV[2], ARGV[3]) end
  local p = redis.call('PTTL', KEYS[1])
  if p > 0 then
    local _, h, r = meta(redis.call('GET', KEYS[3]))
    redis.call('SET', KEYS[3], fmtmeta(want, h, r), 'PX', p)
  end
  return 1
end
return 0
`

// releaseScript releases any number of holds in one call: a script call
// costs the node a fixed overhead several times a plain command's, so a
// batch's releases share one. For release i (from 0), KEYS[4i+1..4i+4] are
// the lock's first four keys and ARGV[4i+1..4i+4] are token, release
// channel, readMarker and which holds: empty for any (write holds first),
// 'w' write only, 'r' read only (the roll-back of a failed attempt takes
// only the kind of hold the attempt could have added). Each release
// removes one hold of its token. Returns one answer per release: 1 when a
// hold was released, 0 when the token held none.
//
// An UNLOCK (empty which) that makes the key free for someone else (the
// last write hold, the last reader) announces it on the channel in the
// same call, so that waiters on every lockproxy instance learn of it
// without a round trip of their own. A roll-back announces nothing: it
// undoes a grant on a minority of nodes, which frees nothing for anyone,
// and announcing it would wake the waiter whose own attempt it rolls back
// (which then spins while the holder holds). An expiry is not announced:
// waiters find it by their retry. The announcement is a pcall: a node user
// whose ACL denies the channel still releases, and waiters fall back to
// their retry.
//
// The releases of one call are for distinct keys (Node.send sees to it),
// so their order within the call does not matter.
const releaseScript = luaMeta + `
local function prune(rk, rhk, now)
  local gone = redis.call('ZRANGEBYSCORE', rk, '-inf', now)
  if #gone > 0 then
    redis.call('ZREMRANGEBYSCORE', rk, '-inf', now)
    for _, r in ipairs(gone) do redis.call('HDEL', rhk, r) end
  end
end
local function nodeNow()
  local t = redis.call('TIME')
  return t[1] * 1000 + math.floor(t[2] / 1000)
end
local function release(k, mk, rk, rhk, tok, ch, marker, which)
  local vm = redis.call('MGET', k, mk)
  local v = vm[1]
  if not v then return 0 end
  if v == tok and which ~= 'r' then
    -- The common case, a single write hold (its lockf is the bare fence),
    -- is taken without parsing lockf.
    local m = vm[2]
    if not m or not string.find(m, ',', 1, true) then
      redis.call('DEL', k, mk)
      if which == '' then redis.pcall('PUBLISH', ch, '') end
      return 1
    end
    local f, h, r = meta(m)
    if h > 0 then
      redis.call('SET', mk, fmtmeta(f, h - 1, r), 'KEEPTTL')
      return 1
    end
    if r == 'r' then
      local now = nodeNow()
      prune(rk, rhk, now)
      redis.call('DEL', mk)
      local top = redis.call('ZRANGE', rk, -1, -1, 'WITHSCORES')
      if #top > 0 then
        redis.call('SET', k, marker, 'PX', tonumber(top[2]) - now)
      else
        redis.call('DEL', k, rk, rhk)
      end
    else
      redis.call('DEL', k, mk)
    end
    if which == '' then redis.pcall('PUBLISH', ch, '') end
    return 1
  end
  if which == 'w' or (v ~= marker and v ~= tok) then return 0 end
  local now = nodeNow()
  prune(rk, rhk, now)
  if not redis.call('ZSCORE', rk, tok) then return 0 end
  if redis.call('HINCRBY', rhk, tok, -1) > 0 then return 1 end
  redis.call('ZREM', rk, tok)
  redis.call('HDEL', rhk, tok)
  if v == tok then
    local f, h = meta(redis.call('GET', mk))
    redis.call('SET', mk, fmtmeta(f, h, ''), 'KEEPTTL')
    return 1
  end
  local top = redis.call('ZRANGE', rk, -1, -1, 'WITHSCORES')
  if #top == 0 then
    redis.call('DEL', k, rk, rhk)
    if which == '' then redis.pcall('PUBLISH', ch, '') end
  else
    redis.call('PEXPIRE', k, tonumber(top[2]) - now)
  end
  return 1
end
local out = {}
for i = 1, #KEYS, 4 do
  out[#out + 1] = release(KEYS[i], KEYS[i + 1], KEYS[i + 2], KEYS[i + 3], ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3])
end
return out
`

// extendScript: KEYS the lock keys (first four); ARGV[1] token, ARGV[2]
// ttl ms, ARGV[3] readMarker. Compare-and-expire, for a write hold (with
// the read hold of a downgrade) or a live reader's own lease. Returns 1
// when the token held the key.
const extendScript = luaMeta + `
local v = redis.call('GET', KEYS[1])
if not v then return 0 end
if v == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  local m = redis.call('GET', KEYS[2])
  if m then redis.call('PEXPIRE', KEYS[2], ARGV[2]) end
  local _, _, r = meta(m)
  if r == 'r' and redis.call('ZSCORE', KEYS[3], ARGV[1]) then` + luaNow + `
    redis.call('ZADD', KEYS[3], now + tonumber(ARGV[2]), ARGV[1])
    local keep = math.max(redis.call('PTTL', KEYS[3]), tonumber(ARGV[2]))
    redis.call('PEXPIRE', KEYS[3], keep)
    redis.call('PEXPIRE', KEYS[4], keep)
  end
  return 1
end
if v ~= ARGV[3] then return 0 end` + luaNow + `
local s = redis.call('ZSCORE', KEYS[3], ARGV[1])
if not s or tonumber(s) <= now then return 0 end
redis.call('ZADD', KEYS[3], now + tonumber(ARGV[2]), ARGV[1])
local keep = tonumber(redis.call('ZRANGE', KEYS[3], -1, -1, 'WITHSCORES')[2]) - now
redis.call('PEXPIRE', KEYS[1], keep)
redis.call('PEXPIRE', KEYS[3], keep)
redis.call('PEXPIRE', KEYS[4], keep)
return 1
`

// infoScript: KEYS the lock keys (all six); ARGV[1] slot, ARGV[2]
// readMarker. Returns 0 when the key is free, else {value, pttl, stored
// fence (the slot counter, which is at least it, while the store is on its
// way), extra holds, now, {reader, lease end, ...}, {reader, holds, ...},
// slot counter}, with the readers whose lease ended left out.
const infoScript = luaMeta + `
local v = redis.call('GET', KEYS[1])
if not v then return 0 end` + luaNow + `
local readers, holds = {}, {}
if redis.call('EXISTS', KEYS[3]) == 1 then
  readers = redis.call('ZRANGEBYSCORE', KEYS[3], '(' .. now, '+inf', 'WITHSCORES')
  holds = redis.call('HGETALL', KEYS[4])
end
local counter = redis.call('HGET', KEYS[6], ARGV[1]) or '0'
local f, h = meta(redis.call('GET', KEYS[2]))
if f == 0 and v ~= ARGV[2] then f = tonumber(counter) end
return {v, redis.call('PTTL', KEYS[1]), f, h, now, readers, holds, counter}
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
	scriptAcquire    = newScript(acquireScript)
	scriptRead       = newScript(readScript)
	scriptRaiseFence = newScript(raiseFenceScript)
	scriptRelease    = newScript(releaseScript)
	scriptExtend     = newScript(extendScript)
	scriptInfo       = newScript(infoScript)
)

// Script is a lock script's source and the SHA1 lockproxy sends in
// EVALSHA.
type Script struct{ Src, SHA string }

// LeaseScripts are the lock scripts whose ARGV[2] is a lease in ms
// (acquire, read, extend); plain SET … PX carries the others. Test tools
// that rewrite leases on the wire (test/faultproxy's fast clock) use it.
func LeaseScripts() []Script {
	var out []Script
	for _, s := range []script{scriptAcquire, scriptRead, scriptExtend} {
		out = append(out, Script{Src: s.src, SHA: s.sha})
	}
	return out
}

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
