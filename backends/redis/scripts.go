package redis

import (
	"crypto/sha1"
	"encoding/hex"

	"github.com/lockproxy/lockproxy/backends"
)

// Every lock operation but a first write grant is one Lua script, so that
// it is atomic on the node and costs one round trip in the node's
// pipeline (a first grant is a plain SET NX PX and HINCRBY; see
// Node.send). Redis's time inside a script is mostly per call (each
// redis.call costs about a microsecond), and the release script is the
// bulk of a node's work per lock: it serves a whole batch's single-hold
// releases, the common UNLOCK, with four calls in all (see releaseScript).
//
// The keys of one lock (client key k, prefix P) on a node:
//
//	P lock:k    string: the write holder's token, or readMarker while
//	            readers hold it; its PX is the lease (for readers, the
//	            longest reader lease). It is a plain string so that a lock
//	            taken with LOCK and one taken with SET NX PX look alike.
//	P lockf:k   string "fence,token": the write hold's fence. A fresh
//	            grant stores it with a plain SET right after the grant (see
//	            Node.send), and nothing but the fence is in this key, so
//	            that SET, which may reach the node after other operations
//	            on the hold (through another instance), cannot undo what
//	            they stored. It may also come after the hold's release and
//	            outlive it: the token it names keeps a later holder from
//	            taking its fence.
//	P lockm:k   string "extra holds,r,token" of the write hold, only while
//	            it has holds beyond the first (reentrancy) or "r" (the
//	            holder also holds it for reading: downgrade); or, on a
//	            single hold made by a marked attempt (a LOCK with TOKEN),
//	            "0,,token,attempt" (acquireMarkedScript), which counts as
//	            none but names the attempt for its roll-back, until a
//	            reentrant grant, a downgrade or a renewal of the hold
//	            replaces or drops it. Written by scripts only. A lockm
//	            of another token (left by an earlier hold) counts as
//	            none.
//	P lockr:k   sorted set: reader tokens scored by lease end (node ms)
//	P lockrh:k  hash: reader token -> holds; and attemptField+token -> the
//	            attempt of the token's latest read grant (its mark: see
//	            lateReadReleaseScript), removed with the token's last hold
//	P lockw:k   sorted set: the tokens of writers waiting with WAIT,
//	            scored by the node time their mark ends; while one has
//	            not ended, new readers queue behind them (see luaMarks)
//
// Meta keys are written to expire with the lock key, but a late lockf, or
// a lock key deleted by hand, can leave one behind for a while: lockf and
// lockm name their token, and one of another token counts as none, so a
// stale one changes nothing for a later holder.
//
// Fence counters live in one hash per node, one field per key slot
// (crc16(key) mod 16384): memory on a node stays bounded however many
// distinct keys are ever locked, and two keys only share a counter when
// they share a slot, which costs nothing but a bigger jump in the fence.
// Fences stay below 2^53, where Lua numbers are exact; but Lua's own
// number-to-string (a .. b) writes them with %.14g, so "1e+14" from 10^14
// on, which lockf's readers (fenceOf) cannot read. A script that writes a
// fence into a string formats it with string.format('%d', f), which
// Redis's Lua 5.1 prints as a 64-bit integer.

// readMarker is the value of a lock key held by readers. TOKEN refuses it.
const readMarker = "\x00lockproxy:read"

// Key order shared by the lock scripts.
const (
	keyLock = iota
	keyFence
	keyHolds
	keyReaders
	keyReaderHolds
	keyWriterWaits
	keyFenceHash
	numLockKeys
)

// luaMeta reads and writes lockm (see above) and reads lockf.
const luaMeta = `
local function meta(s, tok)
  if not s then return 0, '' end
  local h, r, t = string.match(s, '^(%d+),(%a*),(.*)$')
  if t ~= tok then return 0, '' end
  return tonumber(h), r
end
local function fenceOf(s, tok)
  if not s then return 0 end
  local f, t = string.match(s, '^(%d+),(.*)$')
  if t ~= tok then return 0 end
  return tonumber(f)
end
-- putmeta stores tok's lockm (or drops it when it says nothing) to expire
-- with mode: 'KEEPTTL' (it exists), 'PX' and ms, or 'KEY' and the lock
-- key (its PTTL: within a script Redis 7 reads one time, so the two end
-- together; where they could be a millisecond apart the token check in
-- meta covers it).
local function putmeta(mk, h, r, tok, mode, arg)
  if h == 0 and r == '' then
    redis.call('DEL', mk)
    return
  end
  local v = h .. ',' .. r .. ',' .. tok
  if mode == 'KEEPTTL' then
    redis.call('SET', mk, v, 'KEEPTTL')
  elseif mode == 'PX' then
    redis.call('SET', mk, v, 'PX', arg)
  else
    local p = redis.call('PTTL', arg)
    if p > 0 then
      redis.call('SET', mk, v, 'PX', p)
    elseif p == -1 then
      redis.call('SET', mk, v) -- the lock key does not expire either
    else
      redis.call('DEL', mk)
    end
  end
end
`

// luaNow and luaPrune are shared script parts: the node's time in ms, and
// dropping readers whose lease ended.
const luaNow = `
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
`

const luaPrune = `
local gone = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now)
if #gone > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now)
  for _, r in ipairs(gone) do redis.call('HDEL', KEYS[5], r, '\0lockproxy:attempt:' .. r) end
end
`

// luaMarks reads and writes the waiting writers' marks (lockw). Each
// writer has its own member, so one that leaves without the lock takes
// only its own mark away (unmarkScript), and a granted one likewise. A
// mark ends when its writer's next attempt is due at the latest (the end
// of the lease that refused it) plus a margin (ARGV of the acquire
// script), so it outlives the gap to that attempt, which renews it, and a
// writer whose instance died holds readers back no longer than that. The
// key itself expires with its last mark.
//
// A string in lockw is the one mark of an older lockproxy, for all its
// writers (during a rolling upgrade): it counts until it expires by
// itself, and a new mark keeps it as a member of its own (oldMark) ending
// when it would have.
const luaMarks = `
local oldMark = '\0lockproxy:old-mark'
local function nodeNow()
  local t = redis.call('TIME')
  return t[1] * 1000 + math.floor(t[2] / 1000)
end
-- markLeft is how long the first of the unexpired marks on wk lasts (ms,
-- -1 when it does not expire) and whose it is, or nil when no writer
-- waits.
local function markLeft(wk, now)
  local ty = redis.call('TYPE', wk).ok
  if ty == 'none' then return nil end
  if ty == 'zset' then
    local m = redis.call('ZRANGEBYSCORE', wk, '(' .. now, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
    if #m == 0 then return nil end
    return tonumber(m[2]) - now, m[1]
  end
  return redis.call('PTTL', wk), oldMark
end
-- mark sets tok's mark on wk to end at node time t, dropping the marks
-- that ended.
local function mark(wk, tok, now, t)
  local ty = redis.call('TYPE', wk).ok
  if ty == 'zset' then
    redis.call('ZREMRANGEBYSCORE', wk, '-inf', now)
  elseif ty ~= 'none' then
    local p = redis.call('PTTL', wk)
    redis.call('DEL', wk)
    if p > 0 then redis.call('ZADD', wk, now + p, oldMark) end
  end
  redis.call('ZADD', wk, t, tok)
  if redis.call('PTTL', wk) < t - now then redis.call('PEXPIRE', wk, t - now) end
end
-- unmark takes tok's mark off wk; it reports whether there was one. An
-- older lockproxy's string mark is not this writer's: it stays.
local function unmark(wk, tok)
  local r = redis.pcall('ZREM', wk, tok)
  return type(r) == 'number' and r > 0
end
`

// acquireScript follows a failed SET NX PX (see Node.send), or runs alone.
// A reentrant grant extends the lease to at least ARGV[2], never shortening
// it.
// KEYS the lock keys; ARGV[1] token, ARGV[2] ttl ms,
// ARGV[3] slot, ARGV[4] writer-wait ms or 0 (the most its mark may last:
// what is left of its WAIT), ARGV[5] readMarker, ARGV[6] 1 to refuse
// reentry (SET NX's rule) or 0, ARGV[7] the mark's margin in ms, ARGV[8]
// (optional) the attempt's mark, stored where the hold is made afresh
// (see acquireMarkedScript).
// Returns {fence, holds} when granted, or {stored fence or 0, holds, slot
// counter} for a reentrant grant (the token already holds it: one more
// hold, the lease reset), {-1, ms, holder} when held by another, ms the
// lock key's PTTL (the holder's lease, or the longest reader's: when the
// key may be free again unless released first; -1 when it does not
// expire) and holder the lock key's value (the holder's token, or
// readMarker), and -1 when the token holds it for reading (upgrade). A
// refused writer that will wait marks itself on the node (lockw) until
// that lease's end plus the margin, at most ARGV[4], so new readers stop
// joining; a granted one takes its mark away.
//
// A reentrant grant sets the meta keys' expiries before the lock key's,
// so that they never outlive it.
const acquireScript = luaMeta + luaMarks + `
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local f = redis.call('HINCRBY', KEYS[7], ARGV[3], 1)
  redis.call('SET', KEYS[2], string.format('%d', f) .. ',' .. ARGV[1], 'PX', ARGV[2])
  if ARGV[8] and ARGV[8] ~= '' then
    -- A marked attempt's hold (see acquireMarkedScript).
    redis.call('SET', KEYS[3], '0,,' .. ARGV[1] .. ',' .. ARGV[8], 'PX', ARGV[2])
  else
    redis.call('DEL', KEYS[3])
  end
  if ARGV[4] ~= '0' then unmark(KEYS[6], ARGV[1]) end
  return {f, 1}
end
local v = redis.call('GET', KEYS[1])
if v == ARGV[1] and ARGV[6] ~= '1' then
  local fm = redis.call('MGET', KEYS[2], KEYS[3])
  local h, r = meta(fm[2], ARGV[1])
  h = h + 1
  -- A reentrant grant never shortens the lease: its caller may yet be
  -- told no (too slow, no majority), and the hold it had must keep the
  -- lease it was told of.
  local ms = math.max(tonumber(ARGV[2]), redis.call('PTTL', KEYS[1]))
  if r == 'r' then
    -- The token holds it for reading too (a downgrade): the key must not
    -- end before that read lease does.
    local s = redis.call('ZSCORE', KEYS[4], ARGV[1])
    if s then
      local t = redis.call('TIME')
      ms = math.max(ms, tonumber(s) - (t[1] * 1000 + math.floor(t[2] / 1000)))
    end
  end
  redis.call('PEXPIRE', KEYS[2], ms)
  putmeta(KEYS[3], h, r, ARGV[1], 'PX', ms)
  redis.call('PEXPIRE', KEYS[1], ms)
  if ARGV[4] ~= '0' then unmark(KEYS[6], ARGV[1]) end
  -- The fence is 0 when the hold's fence is not stored here (its SET is
  -- still on its way, or was lost with the grant's answer): the quorum
  -- takes the other nodes' fence, or this slot counter, which is at
  -- least the hold's fence.
  return {fenceOf(fm[1], ARGV[1]), h + 1, tonumber(redis.call('HGET', KEYS[7], ARGV[3]) or '0')}
end
if v == ARGV[5] then
  local s = redis.call('ZSCORE', KEYS[4], ARGV[1])
  if s then` + luaNow + `
    if tonumber(s) > now then return -1 end
  end
end
local left = redis.call('PTTL', KEYS[1])
-- Only a writer refused because another token holds the key waits: an
-- upgrade is refused for good, and its mark would turn readers away.
if ARGV[4] ~= '0' then
  local now = nodeNow()
  mark(KEYS[6], ARGV[1], now, now + math.min(tonumber(ARGV[4]), math.max(left, 0) + tonumber(ARGV[7])))
end
return {-1, left, v}
`

// readScript: KEYS the lock keys; ARGV[1] token, ARGV[2] ttl ms, ARGV[3]
// slot, ARGV[4] readMarker, ARGV[5] the attempt (see op.attempt), which a
// grant stores as the token's mark in lockrh (see attemptField and
// lateReadReleaseScript). Returns {fence, holds, write} when granted,
// write 1 when the token holds the key for writing here too (a
// downgrade), else 0;
// {-1, ms, holder} when a writer holds the key (ms its lease left and
// holder its token, as acquireScript's) or waits for it (ms what is left
// of the first waiting writer's mark, which lasts until that writer's
// next attempt is due, and holder that writer's token). Each reader's
// lease is its own score; the lock key lives as long as the longest. The write holder may
// take a read hold too (a downgrade, flagged in its lockm). The fence is
// the slot's counter (for a downgrade, the write hold's, or the counter
// while it is not stored here): at least that of every earlier write.
const readScript = luaMeta + luaMarks + luaNow + `
local v = redis.call('GET', KEYS[1])
if v and v ~= ARGV[4] and v ~= ARGV[1] then return {-1, redis.call('PTTL', KEYS[1]), v} end
if not v then
  redis.call('DEL', KEYS[4], KEYS[5])
else` + luaPrune + `
end
local mine = redis.call('ZSCORE', KEYS[4], ARGV[1])
if not mine and v ~= ARGV[1] then
  local left, who = markLeft(KEYS[6], now)
  if left then return {-1, left, who} end
end
-- A reader's reentry never shortens its lease (see acquireScript).
if not mine or tonumber(mine) < now + tonumber(ARGV[2]) then
  redis.call('ZADD', KEYS[4], now + tonumber(ARGV[2]), ARGV[1])
end
local h = redis.call('HINCRBY', KEYS[5], ARGV[1], 1)
if ARGV[5] and ARGV[5] ~= '' then
  redis.call('HSET', KEYS[5], '\0lockproxy:attempt:' .. ARGV[1], ARGV[5])
end
local keep = tonumber(redis.call('ZRANGE', KEYS[4], -1, -1, 'WITHSCORES')[2]) - now
local fence = tonumber(redis.call('HGET', KEYS[7], ARGV[3]) or '0')
if v == ARGV[1] then
  local p = redis.call('PTTL', KEYS[1])
  if p >= 0 and keep > p then
    -- The read hold outlives the write lease: the key (and the hold's
    -- fence) must too, or its expiry lets a writer in during the read
    -- lease.
    redis.call('PEXPIRE', KEYS[2], keep)
    redis.call('PEXPIRE', KEYS[1], keep)
  end
  keep = math.max(keep, redis.call('PTTL', KEYS[1]))
  local fm = redis.call('MGET', KEYS[2], KEYS[3])
  -- The write hold's fence, or while it is not stored here the slot
  -- counter read above, which is at least it.
  local f = fenceOf(fm[1], ARGV[1])
  if f > 0 then fence = f end
  local wh = meta(fm[2], ARGV[1])
  -- Always: lockm, which flags the downgrade, expires with the key.
  putmeta(KEYS[3], wh, 'r', ARGV[1], 'KEY', KEYS[1])
else
  redis.call('SET', KEYS[1], ARGV[4], 'PX', keep)
end
redis.call('PEXPIRE', KEYS[4], keep)
redis.call('PEXPIRE', KEYS[5], keep)
if v == ARGV[1] then return {fence, h, 1} end
return {fence, h, 0}
`

// raiseFenceScript: KEYS[1] lock key, KEYS[2] fence hash, KEYS[3] lockf,
// KEYS[4] lockr; ARGV[1] token, ARGV[2] slot, ARGV[3] fence, ARGV[4]
// readMarker for a read grant's raise, or empty for a write grant's.
// Raises the slot's counter to the fence while the token still holds the
// key (so a later holder, which must acquire after this key is gone,
// reads it). For a write grant it also stores the grant's fence with the
// hold, expiring with it, for reentrant grants to return; it runs after
// the grant's own fence SET on the same connection (a key's operations
// share one writer), so that SET cannot undo it. A read grant's raise
// stores nothing with the hold (a read fence is not the write hold's, also
// in a downgrade) and needs the token's read lease live here (its score
// in lockr after now) and the lock key held by readers or by the token
// (a downgrade): no write can then be granted here before the raise.
// Returns 1 when the token holds the key.
const raiseFenceScript = `
if ARGV[4] and ARGV[4] ~= '' then
  local v = redis.call('GET', KEYS[1])
  if v ~= ARGV[4] and v ~= ARGV[1] then return 0 end
  local s = redis.call('ZSCORE', KEYS[4], ARGV[1])` + luaNow + `
  if not s or tonumber(s) <= now then return 0 end
  local cur = tonumber(redis.call('HGET', KEYS[2], ARGV[2]) or '0')
  if cur < tonumber(ARGV[3]) then redis.call('HSET', KEYS[2], ARGV[2], ARGV[3]) end
  return 1
end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  local cur = tonumber(redis.call('HGET', KEYS[2], ARGV[2]) or '0')
  local want = tonumber(ARGV[3])
  if cur < want then redis.call('HSET', KEYS[2], ARGV[2], ARGV[3]) end
  local p = redis.call('PTTL', KEYS[1])
  if p > 0 then redis.call('SET', KEYS[3], string.format('%d', want) .. ',' .. ARGV[1], 'PX', p) end
  return 1
end
return 0
`

// owedFenceScript is a fence write a kill stopped, written again after
// the kill (see owed): KEYS lock key, fence hash, lockf; ARGV[1] token,
// ARGV[2] slot, ARGV[3] fence. While the token holds the key it raises
// the slot's counter to the fence and stores the fence with the hold, but
// only where no fence of the token is stored: one that is was stored by
// what followed the fence write on the killed connection (the quorum's
// raise of the same grant, or of a reentrant grant, which may set it
// higher or lower), which the older fence write must not undo. Returns 1
// when the token holds the key.
const owedFenceScript = luaMeta + `
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
local want = tonumber(ARGV[3])
local cur = tonumber(redis.call('HGET', KEYS[2], ARGV[2]) or '0')
if cur < want then redis.call('HSET', KEYS[2], ARGV[2], ARGV[3]) end
if fenceOf(redis.call('GET', KEYS[3]), ARGV[1]) > 0 then return 1 end
local p = redis.call('PTTL', KEYS[1])
if p > 0 then redis.call('SET', KEYS[3], string.format('%d', want) .. ',' .. ARGV[1], 'PX', p) end
return 1
`

// sweepFenceScript undoes a fence write left on a dropped connection that
// is gone now (see owed.sweeps): KEYS lock key, lockf; ARGV[1] token,
// ARGV[2] fence. It deletes lockf where it is that write's value
// ("fence,token") and the token does not hold the key: a late write then
// ran after the hold's release, and its lockf would outlive the hold for
// a whole lease. A lockf of the token's hold (the same write run in time,
// or written again after a kill) stays, as does any other. Returns 1 when
// it deleted lockf.
const sweepFenceScript = `
if redis.call('GET', KEYS[2]) ~= ARGV[2] .. ',' .. ARGV[1] then return 0 end
if redis.call('GET', KEYS[1]) == ARGV[1] then return 0 end
redis.call('DEL', KEYS[2])
return 1
`

// luaAnnounce defines announce(chans), which tells the waiters listening
// on each channel of chans (distinct release channels) that its key is
// free, in as few calls as it can: PUBSUB NUMPAT, then one NUMSUB for all
// of chans, and a PUBLISH only on the channels someone subscribes to (a
// PUBLISH that reaches nobody costs the node a call for nothing). NUMSUB
// does not count pattern listeners (PSUBSCRIBE): while there is one, or
// where the node user's ACL denies PUBSUB, every channel is announced
// blind. Every call is a pcall, so a node user denied PUBSUB, PUBLISH or
// the channel still does the script's work, and waiters fall back to
// their retry. Shared by releaseScript and syncHoldsScript, so that an
// UNLOCK and a transparent release are announced alike.
const luaAnnounce = `
local function announce(chans)
  if #chans == 0 then return end
  local subs
  if redis.pcall('PUBSUB', 'NUMPAT') == 0 then
    subs = redis.pcall('PUBSUB', 'NUMSUB', unpack(chans))
  end
  if not subs or subs.err then
    -- PUBSUB denied, or a pattern listener: announce blind, each PUBLISH
    -- on its own.
    for _, ch in ipairs(chans) do redis.pcall('PUBLISH', ch, '') end
  else
    for j = 2, #subs, 2 do
      if subs[j] > 0 then redis.pcall('PUBLISH', subs[j - 1], '') end
    end
  end
end
`

// luaRelease defines release(k, fk, mk, rk, rhk, tok, marker, which, v, m),
// which removes one hold of tok (see releaseScript), with its helpers
// prune and nodeNow. Shared by releaseScript and lateReadReleaseScript.
const luaRelease = `
local function prune(rk, rhk, now)
  local gone = redis.call('ZRANGEBYSCORE', rk, '-inf', now)
  if #gone > 0 then
    redis.call('ZREMRANGEBYSCORE', rk, '-inf', now)
    for _, r in ipairs(gone) do redis.call('HDEL', rhk, r, '\0lockproxy:attempt:' .. r) end
  end
end
local function nodeNow()
  local t = redis.call('TIME')
  return t[1] * 1000 + math.floor(t[2] / 1000)
end
-- release handles every case but a single write hold; v and m are the
-- lock key's and lockm's values read at the start of the call. It returns
-- the answer and whether the key became free.
local function release(k, fk, mk, rk, rhk, tok, marker, which, v, m)
  if not v then return 0, false end
  if v == tok and which ~= 'r' then
    local h, r = meta(m, tok)
    if h > 0 then
      putmeta(mk, h - 1, r, tok, 'KEEPTTL')
      return 1, false
    end
    if r == 'r' then
      local now = nodeNow()
      prune(rk, rhk, now)
      redis.call('DEL', fk, mk)
      local top = redis.call('ZRANGE', rk, -1, -1, 'WITHSCORES')
      if #top > 0 then
        -- The key is the readers' now: the reader keys end with it, not
        -- with the write lease readScript gave them (the same rule as a
        -- reader's release below).
        local keep = tonumber(top[2]) - now
        redis.call('SET', k, marker, 'PX', keep)
        redis.call('PEXPIRE', rk, keep)
        redis.call('PEXPIRE', rhk, keep)
      else
        redis.call('DEL', k, rk, rhk)
      end
    else
      redis.call('DEL', k, fk, mk)
    end
    return 1, true
  end
  if which == 'w' or (v ~= marker and v ~= tok) then return 0, false end
  local now = nodeNow()
  prune(rk, rhk, now)
  if not redis.call('ZSCORE', rk, tok) then return 0, false end
  if redis.call('HINCRBY', rhk, tok, -1) > 0 then return 1, false end
  redis.call('ZREM', rk, tok)
  redis.call('HDEL', rhk, tok, '\0lockproxy:attempt:' .. tok)
  if v == tok then
    -- The write holder's read hold ends (an undone downgrade).
    local h = meta(m, tok)
    putmeta(mk, h, '', tok, 'KEEPTTL')
    return 1, false
  end
  local top = redis.call('ZRANGE', rk, -1, -1, 'WITHSCORES')
  if #top == 0 then
    redis.call('DEL', k, rk, rhk)
    return 1, true
  end
  -- The reader keys expire with the lock key, or a released longer
  -- lease would keep them after the last hold ends.
  local keep = tonumber(top[2]) - now
  redis.call('PEXPIRE', rk, keep)
  redis.call('PEXPIRE', rhk, keep)
  redis.call('PEXPIRE', k, keep)
  return 1, false
end
`

// releaseScript releases any number of holds in one call: a script call
// costs the node a fixed overhead several times a plain command's, so a
// batch's releases share one. For release i (from 0), KEYS[5i+1..5i+5] are
// the lock's first five keys and ARGV[4i+1..4i+4] are token, release
// channel, readMarker and which holds: empty for any (write holds first),
// 'w' write only, 'r' read only (the roll-back of a failed attempt takes
// only the kind of hold the attempt could have added). Each release
// removes one hold of its token. Returns one answer per release: 1 when a
// hold was released, 0 when the token held none.
//
// Each redis.call costs the node about a microsecond of its own, however
// little the command does, so the call makes as few as it can for the
// whole batch rather than for each release: one MGET reads every lock key
// and lockm, one DEL ends every single write hold (the common UNLOCK), and
// PUBSUB NUMPAT and NUMSUB find the channels anyone listens on. Releases that
// need more (reentrant holds, readers, a downgrade) take their own calls.
//
// An UNLOCK (empty which) that makes the key free for someone else (the
// last write hold, the last reader) announces it on the channel in the
// same call, so that waiters on every lockproxy instance learn of it
// without a round trip of their own; a channel with no subscriber gets no
// PUBLISH, which would reach nobody (unless someone listens by pattern,
// which PUBSUB NUMSUB does not count: then every release is announced).
// A roll-back announces nothing: it
// undoes a grant on a minority of nodes, which frees nothing for anyone,
// and announcing it would wake the waiter whose own attempt it rolls back
// (which then spins while the holder holds). An expiry is not announced:
// waiters find it by their retry. The announcement is a pcall: a node user
// whose ACL denies PUBSUB or the channel still releases, and waiters fall
// back to their retry.
//
// The releases of one call are for distinct keys (Node.send sees to it),
// so their order within the call does not matter, and the DEL that ends
// the single holds can wait for the end of the call.
const releaseScript = luaMeta + luaAnnounce + luaRelease + `
local n = #KEYS / 5
local names = {}
for i = 0, n - 1 do
  names[2 * i + 1] = KEYS[5 * i + 1]
  names[2 * i + 2] = KEYS[5 * i + 3]
end
local vals = redis.call('MGET', unpack(names))
local out, dels, chans = {}, {}, {}
for i = 0, n - 1 do
  local k, tok, which = KEYS[5 * i + 1], ARGV[4 * i + 1], ARGV[4 * i + 4]
  local v, m = vals[2 * i + 1], vals[2 * i + 2]
  local freed
  if v == tok and not m and which ~= 'r' then
    -- A single write hold (a lockm of another token would do too, but
    -- release sorts that out).
    dels[#dels + 1] = k
    dels[#dels + 1] = KEYS[5 * i + 2]
    out[i + 1], freed = 1, true
  else
    out[i + 1], freed = release(k, KEYS[5 * i + 2], KEYS[5 * i + 3], KEYS[5 * i + 4], KEYS[5 * i + 5],
      tok, ARGV[4 * i + 3], which, v, m)
  end
  if freed and which == '' then chans[#chans + 1] = ARGV[4 * i + 2] end
end
if #dels > 0 then redis.call('DEL', unpack(dels)) end
announce(chans)
return out
`

// luaExtendWrite defines extendWriteOf, the write path of a renewal: k
// the lock keys (first five, in the scripts' order), tok the token,
// which holds the key for writing, ms the ttl: the write lease set to the
// ttl, the read hold of a downgrade raised to it but never shortened
// (and left alone once its lease has ended).
// With raise the write lease is only raised, never shortened, as a
// reentry raises it: a KEEPALIVE watchdog's renewal (extendWriteScript)
// renews every write hold of the token, also those taken without
// KEEPALIVE, whose holders were told a longer lease. extendWrite is it for
// KEYS, ARGV[1] token and ARGV[2] ttl ms. Shared by extendScript (RENEW,
// which sets the lease exactly), extendWriteScript (holdkind.go) and
// transparent mode's renewals (syncHoldsScript), so a plain PEXPIRE does
// to a hold what RENEW does.
const luaExtendWrite = `
local function extendWriteOf(k, tok, ms, raise)
  local m = redis.call('GET', k[3])
  local h, r = meta(m, tok)
  if m and h == 0 and r == '' then
    -- A marked attempt's mark (or another token's lockm, which counts as
    -- none): the renewal counts this hold for its holder, so the roll-back
    -- of that attempt, which may come later (sent unheard, or in doubt),
    -- must no longer remove it (lateGrantReleaseScript).
    redis.call('DEL', k[3])
    m = false
  end
  local s
  if r == 'r' then s = redis.call('ZSCORE', k[4], tok) end
  if s then` + luaNow + `
    -- Likewise the read hold's mark (lateReadReleaseScript), where the
    -- attempt it names made the one read hold: it is renewed for its
    -- holder too. Over more holds the roll-back takes one, the
    -- attempt's, and leaves the holder's.
    if tonumber(redis.call('HGET', k[5], tok) or '0') <= 1 then
      redis.call('HDEL', k[5], '\0lockproxy:attempt:' .. tok)
    end
    -- The token's read hold (a downgrade) rides along while its lease
    -- lasts, but is never shortened: it keeps others' writes out for the
    -- whole lease its holder was told of. The keys live until the later
    -- of the two ends (acquireScript's rule), and the reader keys no
    -- longer. A read lease that has ended stays ended (as
    -- extendReadScript refuses to renew it): raising it would hold the
    -- key for a read hold nobody holds once the write hold is released.
    s = tonumber(s)
    if s > now then
      if s < now + ms then
        redis.call('ZADD', k[4], now + ms, tok)
      else
        ms = s - now
      end
    end
    redis.call('PEXPIRE', k[4], ms)
    redis.call('PEXPIRE', k[5], ms)
  end
  if raise then ms = math.max(ms, redis.call('PTTL', k[1])) end
  redis.call('PEXPIRE', k[2], ms)
  if m then redis.call('PEXPIRE', k[3], ms) end
  redis.call('PEXPIRE', k[1], ms)
  return 1
end
local function extendWrite(raise)
  return extendWriteOf(KEYS, ARGV[1], tonumber(ARGV[2]), raise)
end
`

// extendScript: KEYS the lock keys (first five); ARGV[1] token, ARGV[2]
// ttl ms, ARGV[3] readMarker. Compare-and-expire, for a write hold (with
// the live read hold of a downgrade, whose lease it raises to the ttl but
// never shortens) or a live reader's own lease. Returns 1 when it renewed
// the token's write hold, 2 its read hold alone (the key is held by
// readers), 0 when the token held neither. The meta keys' expiries are
// set before the lock key's, so that they never outlive it.
const extendScript = luaMeta + luaExtendWrite + `
local v = redis.call('GET', KEYS[1])
if not v then return 0 end
if v == ARGV[1] then return extendWrite() end
if v ~= ARGV[3] then return 0 end` + luaNow + `
local s = redis.call('ZSCORE', KEYS[4], ARGV[1])
if not s or tonumber(s) <= now then return 0 end
redis.call('ZADD', KEYS[4], now + tonumber(ARGV[2]), ARGV[1])
-- The renewal counts the token's read hold here for its holder: the
-- roll-back of the attempt whose mark it bears, which may come later,
-- must no longer remove it where that attempt made the one read hold
-- (lateReadReleaseScript). Over more holds the roll-back takes one, the
-- attempt's, and leaves the holder's.
if tonumber(redis.call('HGET', KEYS[5], ARGV[1]) or '0') <= 1 then
  redis.call('HDEL', KEYS[5], '\0lockproxy:attempt:' .. ARGV[1])
end
local keep = tonumber(redis.call('ZRANGE', KEYS[4], -1, -1, 'WITHSCORES')[2]) - now
redis.call('PEXPIRE', KEYS[1], keep)
redis.call('PEXPIRE', KEYS[4], keep)
redis.call('PEXPIRE', KEYS[5], keep)
return 2
`

// syncHoldsScript follows every transparent-mode command that may write
// lock keys (PEXPIRE, EXPIRE, SET, DEL, UNLINK, EVAL) in the same MULTI,
// so that a hold's other keys follow what the command did to its lock
// key. Transparent code renews a lock by extending the lock key alone
// (PEXPIRE, a compare-and-PEXPIRE script, SET XX PX of its own token);
// were the hold's fence (lockf) and extra reentrant holds (lockm) left to
// expire at the first TTL, a token holding the lock twice with LOCK would
// lose its second hold and one UNLOCK would free a lock it still holds.
// KEYS are the first five lock keys of each lock key the command named;
// ARGV[1] readMarker, then ARGV[i+2] the release channel of the i-th lock
// key (from 0, in the order of KEYS). For each lock key:
//   - held for writing (a string token) with a TTL: the token's hold is
//     renewed to that TTL as RENEW renews it (extendWriteOf: lockf and
//     lockm expire with the key, a downgrade's read hold is never
//     shortened, the key living until it ends). The value is the token:
//     a transparent client does not say it, and a command that changed
//     the value made a new hold, whose keys this only lines up. A lockm
//     of another token (left where a command overwrote a hold) is
//     dropped, so a later hold of that token does not inherit it. But a
//     hold whose lease is still the one lockproxy last set (its lockf
//     names the token and ends with the lock key, as every lock script
//     leaves them) was not renewed by the command (another client's
//     compare-and-PEXPIRE that found its own value gone, a PEXPIRE of
//     another key in the same command): it is left as it is, the mark
//     of a marked attempt (acquireMarkedScript, readScript's read mark
//     of a downgrade) included, so that the roll-back of that attempt,
//     if it failed, still removes its hold (lateGrantReleaseScript,
//     lateReadReleaseScript). Taken off as a renewal takes it, the
//     failed attempt's hold kept the key for its whole TTL
//     (TestTransparentNoOpKeepsFailedAttemptsMark). "Ends with" allows
//     2 ms (PTTL reads the clock): a renewal that moved the lease by less
//     is not told from none.
//   - held for writing without expiry: left alone. No lock is: a script
//     that leaves one is rolled back (decideScript), and making lockf
//     persistent would keep a fence record, possibly another token's,
//     for good.
//   - absent (DEL, a release, PEXPIRE 0): lockm is dropped; a later
//     hold of the same token must not count the deleted hold's extra
//     holds. lockf stays: it names its token, which no later holder's
//     fence takes from it (see above). The key's freeing is announced on
//     its release channel as an UNLOCK's is (announce, once per channel
//     however often the command named the key), so LOCK … WAIT waiters
//     try at once rather than at their fallback retry, up to a second
//     later. It is announced whenever the key is absent after the
//     command, even where the command did not delete it (a PEXPIRE of a
//     free key): "the key is free now" is all a waiter needs, and a
//     waiter woken for nothing tries once and waits again.
//   - held by readers, or another type: left alone (a reader's lease is
//     its own; a non-string value is refused, see nonStringLock).
//
// Returns 1.
const syncHoldsScript = luaMeta + luaExtendWrite + luaAnnounce + `
local chans, seen = {}, {}
for i = 0, #KEYS / 5 - 1 do
  local k = {KEYS[5 * i + 1], KEYS[5 * i + 2], KEYS[5 * i + 3], KEYS[5 * i + 4], KEYS[5 * i + 5]}
  local ty = redis.call('TYPE', k[1]).ok
  if ty == 'none' then
    redis.call('DEL', k[3])
    local ch = ARGV[i + 2]
    if ch and not seen[ch] then
      seen[ch] = true
      chans[#chans + 1] = ch
    end
  elseif ty == 'string' then
    local v = redis.call('GET', k[1])
    if v ~= ARGV[1] then
      local p = redis.call('PTTL', k[1])
      -- The lease as lockproxy last set it (lockf, the hold's own, ends
      -- with the lock key: two PTTLs, or two SETs of one script, may read
      -- the clock a millisecond apart): the command renewed nothing.
      if fenceOf(redis.call('GET', k[2]), v) == 0 or math.abs(p - redis.call('PTTL', k[2])) > 2 then
        local m = redis.call('GET', k[3])
        if m and select(3, string.match(m, '^(%d+),(%a*),(.*)$')) ~= v then redis.call('DEL', k[3]) end
        if p > 0 then extendWriteOf(k, v, p) end
      end
    end
  end
end
announce(chans)
return 1
`

// infoScript: KEYS the lock keys (all seven); ARGV[1] slot, ARGV[2]
// readMarker. Returns 0 when the key is free, else {value, pttl, stored
// fence (0 when none is stored for the holder: its store is on its way or
// was lost), extra holds, now, {reader, lease end, ...}, {reader, holds,
// ...}, slot counter}, with the readers whose lease ended left out.
const infoScript = luaMeta + `
local v = redis.call('GET', KEYS[1])
if not v then return 0 end` + luaNow + `
local readers, holds = {}, {}
if redis.call('EXISTS', KEYS[4]) == 1 then
  readers = redis.call('ZRANGEBYSCORE', KEYS[4], '(' .. now, '+inf', 'WITHSCORES')
  holds = redis.call('HGETALL', KEYS[5])
end
local counter = redis.call('HGET', KEYS[7], ARGV[1]) or '0'
local fm = redis.call('MGET', KEYS[2], KEYS[3])
local f = fenceOf(fm[1], v)
local h = meta(fm[2], v)
return {v, redis.call('PTTL', KEYS[1]), f, h, now, readers, holds, counter}
`

// unmarkScript takes a waiting writer's mark off the node when it leaves
// without the lock (its WAIT ran out, its client went away) or was
// granted without this node. KEYS the lock keys (first six); ARGV[1]
// token, ARGV[2] release channel, ARGV[3] readMarker. Returns 1 when the
// token had a mark here. When that was the last mark and no writer holds
// the key, readers may now be let in: that is announced on the channel
// like a release (only where someone listens, as releaseScript does), so
// readers waiting on every instance try at once rather than when the mark
// would have ended.
const unmarkScript = luaMarks + luaAnnounce + `
if not unmark(KEYS[6], ARGV[1]) then return 0 end
local v = redis.call('GET', KEYS[1])
if (v and v ~= ARGV[3]) or markLeft(KEYS[6], nodeNow()) then return 1 end
announce({ARGV[2]})
return 1
`

// acquireMarkedScript is the first step of an acquire marked with an
// attempt (see op.attempt), in place of the plain SET NX PX and HINCRBY:
// on a free key it makes the hold, stores its fence (lockf) and the
// attempt's mark (lockm "0,,token,attempt", which meta reads as no lockm:
// its token part is not the token) and takes the granted writer's
// waiting mark off; on a held key it does nothing and answers nil, and the
// acquire goes on as acquireScript (Node.send), as after a failed SET NX.
// So an attempt whose answer is lost has either made a hold with its mark
// or changed nothing (see lateGrantReleaseScript). KEYS lock, lockf,
// lockm, lockw, fence hash; ARGV[1] token, ARGV[2] ttl ms, ARGV[3] slot,
// ARGV[4] the attempt, ARGV[5] "1" to take the waiting mark off. ZREM by
// pcall: an older lockproxy's string mark answers WRONGTYPE and stays (it
// is not this writer's).
const acquireMarkedScript = `
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return false end
local f = redis.call('HINCRBY', KEYS[5], ARGV[3], 1)
redis.call('SET', KEYS[2], string.format('%d', f) .. ',' .. ARGV[1], 'PX', ARGV[2])
redis.call('SET', KEYS[3], '0,,' .. ARGV[1] .. ',' .. ARGV[4], 'PX', ARGV[2])
if ARGV[5] == '1' then redis.pcall('ZREM', KEYS[4], ARGV[1]) end
return f
`

// lateGrantReleaseScript is the roll-back of an acquire in doubt (see
// owed): one sent on a connection that was dropped before its answer came,
// which may have run, may run later (unless the connection is killed
// first), or never. It removes only what such an acquire alone can have
// left.
//
// An acquire that may join a hold of its token (a LOCK with TOKEN) is
// marked with an attempt (ARGV[2], see op.attempt): acquireMarkedScript
// stores the mark in lockm, with the hold's fence, where it makes the
// hold afresh, and changes nothing where the key is held (a reentrant
// hold is added only by acquireScript, sent once that answer is read).
// Its hold is removed only where lockm is still that mark: a hold the
// token had before, also one whose fence write was lost, has none, a
// reentrant hold added since replaced it (the hold count), and a renewal
// since (RENEW, a KEEPALIVE renewal, a transparent one) took it away: a
// holder was told of the renewed hold, which it may count on this node.
//
// An unmarked acquire ("") has a token that held nothing before (a LOCK
// without TOKEN, a transparent SET NX): its hold is the token's write
// hold made by its SET NX (Node.send), which has neither a stored fence
// (lockf: its fence write follows the answer, which never came) nor a
// lockm of the token. Those stay where present, as the acquire's own
// answer being lost made them before.
//
// Nothing is announced (a roll-back frees nothing anyone waits for).
// KEYS lock, lockf, lockm; ARGV[1] token, ARGV[2] the attempt or "".
// Returns {1} when it removed the hold, else {0} (the release script's
// answer).
const lateGrantReleaseScript = luaMeta + `
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return {0} end
local fm = redis.call('MGET', KEYS[2], KEYS[3])
if ARGV[2] and ARGV[2] ~= '' then
  if fm[2] ~= '0,,' .. ARGV[1] .. ',' .. ARGV[2] then return {0} end
  redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
  return {1}
end
local h, r = meta(fm[2], ARGV[1])
if h > 0 or r ~= '' or fenceOf(fm[1], ARGV[1]) > 0 then return {0} end
redis.call('DEL', KEYS[1])
return {1}
`

// lateReadReleaseScript is the roll-back of a read acquire in doubt (see
// owed), lateGrantReleaseScript's counterpart. A read acquire may join a
// read hold its token has already (RLOCK with TOKEN, a downgrade), and a
// plain release of one read hold cannot tell the two apart: one that
// runs where the acquire never did (killed on its dropped connection)
// takes the token's earlier hold. So every read acquire is marked with
// its attempt: a grant stores the attempt as the token's mark in lockrh
// (field attemptField..token, which no reader token can be: TOKEN refuses
// the prefix), and this removes one read hold of the token only where the
// mark is still this attempt's, taking the mark away. A later grant to
// the token replaced the mark, or a renewal of its one read hold took it
// away (its holder was told of the renewed hold): then a hold stays until
// its lease ends, which costs time, never safety. KEYS the lock's first
// five keys; ARGV[1] token, ARGV[2] the attempt, ARGV[3] readMarker. Nothing is
// announced. Returns {1} when it removed a hold, else {0}.
const lateReadReleaseScript = luaMeta + luaRelease + `
local f = '\0lockproxy:attempt:' .. ARGV[1]
if redis.call('HGET', KEYS[5], f) ~= ARGV[2] then return {0} end
redis.call('HDEL', KEYS[5], f)
local vm = redis.call('MGET', KEYS[1], KEYS[3])
local n = release(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], ARGV[1], ARGV[3], 'r', vm[1], vm[2])
return {n}
`

// attemptField prefixes the token in a read attempt's mark (see
// lateReadReleaseScript); the scripts spell it out.
const attemptField = "\x00lockproxy:attempt:"

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
	scriptAcquire       = newScript(acquireScript)
	scriptAcquireMarked = newScript(acquireMarkedScript)
	scriptRead          = newScript(readScript)
	scriptRaiseFence    = newScript(raiseFenceScript)
	scriptRelease       = newScript(releaseScript)
	scriptExtend        = newScript(extendScript)
	scriptInfo          = newScript(infoScript)
	scriptUnmark        = newScript(unmarkScript)
	scriptSyncHolds     = newScript(syncHoldsScript)
	scriptLateGrant     = newScript(lateGrantReleaseScript)
	scriptLateRead      = newScript(lateReadReleaseScript)
	scriptOwedFence     = newScript(owedFenceScript)
	scriptSweepFence    = newScript(sweepFenceScript)
	// scriptProbe is Ready's: a node that runs it runs scripts.
	scriptProbe = newScript("return 1")
)

// batchScripts are the scripts batches send with EVALSHA (Node.send); a
// writer's connection loads them when it is made (Node.connect).
var batchScripts = []script{scriptAcquire, scriptAcquireMarked, scriptRead, scriptRaiseFence, scriptRelease, scriptExtend, scriptExtendHold[backends.Write], scriptExtendHold[backends.Read]}

// Script is a lock script's source and the SHA1 lockproxy sends in
// EVALSHA.
type Script struct{ Src, SHA string }

// LeaseScripts are the lock scripts whose ARGV[2] is a lease in ms
// (acquire, marked acquire, read, extend, and a watchdog's renewal of one kind of hold);
// plain SET … PX carries the others. Test tools that rewrite leases on the
// wire (test/faultproxy's fast clock) use it.
func LeaseScripts() []Script {
	var out []Script
	for _, s := range append(append([]script{scriptAcquire, scriptRead, scriptExtend}, scriptExtendHold[:]...), scriptAcquireMarked) {
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
