"""The Store in Redis: one Lua script commits claims, effects, fold state, pending Kafka effects
and the cursor together, after checking the owner epoch (a zombie cannot write) and
compare-and-setting the cursor.

Every key of one (subscription, partition) carries the same hash tag,
``rh:<env>:{<slug>|<topic>|<partition>}:…``, so a script never spans hash slots and Redis can be
sharded by partition (Redis Cluster: :func:`consumers.redis_conn.connect_cluster`). The scripts
are given the partition's key prefix and name the claim, effect
and failure keys under it themselves: they all share the hash tag (and so the slot) of the
progress key each script is declared with.

One poll, one round trip each way: :meth:`RedisStore.decisions_many` sends one read-only lookup
script per partition and :meth:`RedisStore.commit_many` one commit script per partition, in one
pipeline without a transaction (each script is atomic on its own). A commit travels as a single
msgpack argument the script unpacks with ``cmsgpack``; its effect ops are coalesced first
(:func:`coalesce`) where the end state is exactly the one of the ops applied one by one, when
they come back to their keys often enough for that to pay (:func:`effect_calls`).

Claims: Redis 7.0 has no per-field TTL, so claims live in day buckets that expire whole (a day
after the stream's retention plus a margin). Each day of a partition is split into
``claim_buckets`` small hashes, ``…:claims:<day>:<n>``, the bucket picked from random bits of the
event id: a small hash stays a listpack, about 20 bytes a claim where a set of binary strings is a
hashtable at 70 and more. A field is the event's 16 id bytes, its value the cursor revisions it
was claimed at (``3``, ``3d`` for dead-lettered, ``3,5d`` for several). Before this layout a day
was one set, ``…:claims:<day>`` of members ``<id bytes><revision>[d]``: lookups still check those
sets (until they expire), writes go to the hashes only.
"""

from __future__ import annotations

import math
import re
import zlib
from collections.abc import Iterable, Sequence

import msgpack  # type: ignore[import-untyped]
import orjson
import redis

from consumers.redis_conn import Script, Wait, run_script_calls
from consumers.runtime import slot_claims
from consumers.runtime.layout import LAYOUT, WRITES_SLOT_CLAIMS, environment_key
from consumers.runtime.slot_claims import SlotRef
from consumers.runtime.store import (
    NO_SLOTS,
    OPS,
    Commit,
    Decisions,
    Slots,
    decode_pending,
    encode_pending,
)
from consumers.runtime.types import JSON, TP, OutRecord, Progress, RedisOp
from streams.clock import Clock
from streams.errors import ClaimsFound, CursorMoved, Fenced, LayoutNewer, PendingEffects

DAY_MS = 86_400_000
# How long a store trusts its memory of which of today's claim hashes it gave their expiry: the
# expiry is one call a hash a day instead of one a hash a commit, and a hash Redis lost and a
# later commit wrote again is given its expiry again within this long.
EXPIRY_MEMORY_S = 60.0

# What every script shares: a claim's revisions, chunked variadic calls (well under Lua's stack
# limit), the claim lookup of every live day (new hashes, then the old sets) and the claim write.
_LUA_CLAIMS = (
    slot_claims.LUA
    + """
local CHUNK = 1000
-- The partition's layout (consumers.runtime.layout): nil if this release may write, else the
-- newer layout found.
local function layout_refused(key, speaks)
  local found = tonumber(redis.call('GET', key) or '1')
  if found > tonumber(speaks) then return found end
  return nil
end
local function layout_of(key)
  return tonumber(redis.call('GET', key) or '1')
end
local function head(t, n)
  if n == #t then return t end
  local out = {}
  for i = 1, n do out[i] = t[i] end
  return out
end
-- The first n entries of fields/subs/known (and tok) split in two, those written by id first:
-- an outbox event's claim is written by id only while the partition is in layout 1.
local function by_id_first(fields, subs, known, tok, refs, n, marker)
  if marker < 2 then return fields, subs, known, tok, n end
  local order = {}
  for i = 1, n do if not refs[i] then order[#order + 1] = i end end
  local nw = #order
  if nw == n then return fields, subs, known, tok, n end
  for i = 1, n do if refs[i] then order[#order + 1] = i end end
  for i = n + 1, #fields do order[#order + 1] = i end
  local f, b, k = {}, {}, {}
  for j, i in ipairs(order) do
    f[j] = fields[i]; b[j] = subs[i]
    if known then k[j] = known[i] end
  end
  return f, b, (known and k or nil), function(j) return tok(order[j]) end, nw
end
local function has(v, t)
  if v == t then return true end
  return string.find(',' .. v .. ',', ',' .. t .. ',', 1, true) ~= nil
end
local function variadic(cmd, key, list, first)
  for c = first, #list, CHUNK do
    redis.call(cmd, key, unpack(list, c, math.min(c + CHUNK - 1, #list)))
  end
end
-- Marks found[i] with 1 (claimed as applied at rev) and 2 (dead-lettered at rev); today's values
-- land in known[i] for the write that may follow.
local function look(P, days, fields, subs, rev, want, found, known)
  local ta, td = rev, rev .. 'd'
  -- Only the days this partition wrote claims on have hashes to look in.
  local written = {}
  for _, d in ipairs(redis.call('SMEMBERS', P .. 'claims:days')) do written[d] = true end
  for di = 1, #days do
    if written[tostring(days[di])] then
      local dp = P .. 'claims:' .. days[di] .. ':'
      for i = 1, #fields do
        local v = redis.call('HGET', dp .. subs[i], fields[i])
        if di == 1 and known then known[i] = v end
        if v then
          local w = want(i)
          if w ~= 2 and has(v, ta) then found[i] = (found[i] or 0) + 1 end
          if w ~= 1 and has(v, td) then found[i] = (found[i] or 0) + 2 end
        end
      end
    end
    local old = P .. 'claims:' .. days[di]
    if redis.call('EXISTS', old) == 1 then
      for c = 1, #fields, CHUNK do
        local last = math.min(c + CHUNK - 1, #fields)
        local m = {}
        for i = c, last do
          local w = want(i)
          if w ~= 2 then m[#m + 1] = fields[i] .. ta else m[#m + 1] = '' end
          if w ~= 1 then m[#m + 1] = fields[i] .. td else m[#m + 1] = '' end
        end
        local hits = redis.call('SMISMEMBER', old, unpack(m))
        for h = 1, #hits, 2 do
          local i = c + (h - 1) / 2
          if hits[h] == 1 then found[i] = (found[i] or 0) + 1 end
          if hits[h + 1] == 1 then found[i] = (found[i] or 0) + 2 end
        end
      end
    end
  end
end
-- Today among the partition's days with claims (the set lives as long as its latest day; a day
-- past the oldest live one leaves it, its hashes deleted: their expiry is the fallback). Whether
-- today was new there: then every hash touched today is given its expiry, whatever the caller
-- remembers having done (a Redis that lost its data lost the set too).
local function note_day(P, day, oldest, expire_at, buckets)
  local mk = P .. 'claims:days'
  for _, d in ipairs(redis.call('SMEMBERS', mk)) do
    if tonumber(d) < oldest then
      redis.call('SREM', mk, d)
      local dp = P .. 'claims:' .. d .. ':'
      for b = 0, buckets - 1 do redis.call('UNLINK', dp .. b) end
    end
  end
  local new = redis.call('SADD', mk, day) == 1
  if redis.call('EXPIRETIME', mk) < expire_at then redis.call('EXPIREAT', mk, expire_at) end
  return new
end
-- The expiry of today's hashes: those named in expire (the caller's, which has not given them
-- theirs yet today), or every one touched when expire is nil or today is new.
local function expire_hashes(dp, touched, expire, new, expire_at)
  if new or not expire then
    for k in pairs(touched) do redis.call('EXPIREAT', k, expire_at) end
  else
    for _, b in ipairs(expire) do redis.call('EXPIREAT', dp .. b, expire_at) end
  end
end
-- Adds token tok(i) to the value of fields[i] in today's hash of subs[i]. Returns whether today
-- was new among the partition's days.
local function write_claims(P, day, oldest, expire_at, buckets, fields, subs, tok, known, expire)
  local dp = P .. 'claims:' .. day .. ':'
  local now, touched = {}, {}
  for i = 1, #fields do
    local f = fields[i]
    local k = dp .. subs[i]
    local cur = now[f]
    if cur == nil then
      if known then cur = known[i] or false else cur = redis.call('HGET', k, f) end
    end
    local t = tok(i)
    if not cur then
      cur = t; redis.call('HSET', k, f, cur)
    elseif not has(cur, t) then
      cur = cur .. ',' .. t; redis.call('HSET', k, f, cur)
    end
    now[f] = cur
    touched[k] = true
  end
  local new = note_day(P, day, oldest, expire_at, buckets)
  expire_hashes(dp, touched, expire, new, expire_at)
  return new
end
-- For a commit not looked up first: is any of these events claimed at all, at any revision up
-- to rev, applied or dead-lettered, on a live day before today, or today for those past the
-- first nclaim (checked only; today's hashes of the others: see claim_new), or in the old day
-- sets?
local function claimed_before(P, days, fields, subs, rev, nclaim)
  local written = {}
  for _, d in ipairs(redis.call('SMEMBERS', P .. 'claims:days')) do written[d] = true end
  for di = 1, #days do
    if written[tostring(days[di])] then
      local dp = P .. 'claims:' .. days[di] .. ':'
      for i = (di == 1 and nclaim + 1 or 1), #fields do
        if redis.call('HEXISTS', dp .. subs[i], fields[i]) == 1 then return true end
      end
    end
  end
  for di = 1, #days do
    local old = P .. 'claims:' .. days[di]
    if redis.call('EXISTS', old) == 1 then
      for i = 1, #fields do
        for r = 0, tonumber(rev) do
          if redis.call('SISMEMBER', old, fields[i] .. r) == 1 then return true end
          if redis.call('SISMEMBER', old, fields[i] .. r .. 'd') == 1 then return true end
        end
      end
    end
  end
  return false
end
-- Claims today's new fields of the first n, one HSETNX each: a field already there is an event
-- claimed today (at whatever revision), and then the fields this call set are taken back and it
-- returns nil, having written nothing. Else the touched hashes, for their expiry.
local function claim_new(dp, fields, subs, n, tok)
  local touched = {}
  for i = 1, n do
    local k = dp .. subs[i]
    if redis.call('HSETNX', k, fields[i], tok(i)) == 0 then
      for j = i - 1, 1, -1 do redis.call('HDEL', dp .. subs[j], fields[j]) end
      return nil
    end
    touched[k] = true
  end
  return touched
end
"""
)

# ARGV[1]: msgpack [revision, days, fields, buckets, slot refs]; ARGV[2]: the partition's key
# prefix. Answers one digit an event: 0 none, 1 applied, 2 dead-lettered, 3 both, 4 an outbox
# event whose slot another event holds (and no claim by its id).
_DECISIONS = (
    _LUA_CLAIMS
    + """
local a = cmsgpack.unpack(ARGV[1])
local P = ARGV[2]
local fields, refs = a[3], a[5]
local found = {}
look(P, a[2], fields, a[4], a[1], function(i) return 0 end, found, nil)
local cache = {}
for i = 1, #fields do
  local ref = refs[i]
  if ref then
    local v = sc_verdict(sc_open(P, a[1], cache, ref).r, ref[4], ref[5])
    local c = found[i] or 0
    if c == 0 then c = v
    elseif v == 1 and c % 2 == 0 then c = c + 1
    elseif v == 2 and c < 2 then c = c + 2 end
    found[i] = c
  end
end
local out = {}
for i = 1, #fields do out[i] = string.char(48 + (found[i] or 0)) end
return table.concat(out)
"""
)

# ARGV[1]: msgpack of the commit (see RedisStore._packed); ARGV[2]: the partition's key prefix.
_COMMIT = (
    _LUA_CLAIMS
    + """
local a = cmsgpack.unpack(ARGV[1])
local P = ARGV[2]
local newer = layout_refused(P .. 'layout', a[26])
if newer then return {'LAYOUT', tostring(newer)} end
local progress, pending = P .. 'progress', P .. 'pending'
local cur = redis.call('GET', P .. 'epoch') or '0'
if cur ~= a[1] then return {'FENCED', cur} end
local at = redis.call('HMGET', progress, 'acked_through', 'cursor_revision', 'fold_generation')
local acked, rev, gen = at[1] or '-1', at[2] or '0', at[3] or '0'
if acked ~= a[2] or rev ~= a[3] or gen ~= a[4] then return {'MOVED', acked, rev} end
-- New pending Kafka effects must never replace ones not yet known to be published.
if a[5] == 1 and redis.call('EXISTS', pending) == 1 then return {'PENDING'} end
local days, fields, subs, napplied, crev = a[7], a[8], a[9], a[10], a[11]
local looked, expire, buckets, nclaim = a[20] == 1, a[21], a[22], a[23]
local function want(i) if i <= napplied then return 1 end return 2 end
local dead = crev .. 'd'
local function tok(i) if i <= napplied then return crev end return dead end
local refs, horizon, target = a[24], a[25], tonumber(a[27])
local marker = math.max(layout_of(P .. 'layout'), target)
local cache = {}
local newday = false
if #fields > 0 and looked then
  local known, found = {}, {}
  look(P, days, fields, subs, crev, want, found, known)
  for i = 1, #fields do if found[i] then return {'CLAIMED'} end end
  for i = 1, #fields do
    local ref = refs[i]
    if ref then
      local v = sc_verdict(sc_open(P, crev, cache, ref).r, ref[4], ref[5])
      if v == 4 or v == want(i) then return {'CLAIMED'} end
    end
  end
  -- Every check passed: from here on the script only writes.
  local f, b, k, t, n = by_id_first(fields, subs, known, tok, refs, #fields, marker)
  f = head(f, n)
  if n > 0 then
    newday = write_claims(P, days[1], days[#days], a[6], buckets, f, b, t, k, expire)
  end
elseif #fields > 0 then
  for i = 1, #fields do
    local ref = refs[i]
    if ref and sc_verdict(sc_open(P, crev, cache, ref).r, ref[4], ref[5]) ~= 0 then
      return {'CLAIMS'}
    end
  end
  local f, b, _, t, n = by_id_first(fields, subs, nil, tok, refs, nclaim, marker)
  if claimed_before(P, days, f, b, crev, n) then return {'CLAIMS'} end
  if n > 0 then
    local dp = P .. 'claims:' .. days[1] .. ':'
    local touched = claim_new(dp, f, b, n, t)
    if not touched then return {'CLAIMS'} end
    -- The claims are written and every check passed: from here on the script only writes.
    newday = note_day(P, days[1], days[#days], a[6], buckets)
    expire_hashes(dp, touched, expire, newday, a[6])
  end
end
if marker > layout_of(P .. 'layout') then redis.call('SET', P .. 'layout', marker) end
if a[28] == 1 then
  for i = 1, nclaim do
    local ref = refs[i]
    if ref then
      local e = sc_open(P, crev, cache, ref)
      sc_claim(e.r, ref[4], ref[5], i > napplied, horizon)
      e.dirty = true
    end
  end
  for _, ref in ipairs(a[29]) do
    local e = sc_open(P, crev, cache, ref)
    sc_claim(e.r, ref[4], ref[5], false, horizon)
    e.dirty = true
  end
  sc_flush(cache)
end
if #a[12] > 0 then variadic('HSET', progress, a[12], 1) end
if #a[13] > 0 then variadic('HSET', P .. 'state', a[13], 1) end
if #a[14] > 0 then variadic('HDEL', P .. 'state', a[14], 1) end
if a[5] == 1 then redis.call('SET', pending, a[15]) end
local X = P .. 'x:'
for r = 1, #a[16] do
  local o = a[16][r]
  local name, k = o[1], X .. o[2]
  if name == 'HSET' or name == 'HDEL' or name == 'SADD' or name == 'SREM' or name == 'RPUSH' then
    variadic(name, k, o, 3)
  elseif name == 'HINCRBY' then
    for j = 3, #o, 2 do redis.call('HINCRBY', k, o[j], o[j + 1]) end
  elseif name == 'HMAX' then
    for c = 3, #o, CHUNK do
      local last = math.min(c + CHUNK - 1, #o)
      local f = {}
      for j = c, last, 2 do f[#f + 1] = o[j] end
      local have = redis.call('HMGET', k, unpack(f))
      local w = {}
      for j = c, last, 2 do
        local h = have[(j - c) / 2 + 1]
        if (not h) or tonumber(o[j + 1]) > tonumber(h) then
          w[#w + 1] = o[j]; w[#w + 1] = o[j + 1]
        end
      end
      if #w > 0 then redis.call('HSET', k, unpack(w)) end
    end
  elseif name == 'LPUSHTRIM' then
    variadic('LPUSH', k, o, 4)
    local cap = tonumber(o[3])
    if cap > 0 then redis.call('LTRIM', k, 0, cap - 1) else redis.call('DEL', k) end
  elseif name == 'SET' then redis.call('SET', k, o[3])
  elseif name == 'INCRBY' then redis.call('INCRBY', k, o[3])
  elseif name == 'DEL' then redis.call('DEL', k)
  elseif name == 'SLOT' then
    -- o: SLOT, hash, missing set, cap, then the slots in order; high and the missing count are
    -- read once and high written once.
    local missing, cap = X .. o[3], tonumber(o[4])
    local high = tonumber(redis.call('HGET', k, 'high') or '0')
    local was, n = high, nil
    for j = 5, #o do
      local slot = tonumber(o[j])
      if slot > high then
        if n == nil then n = redis.call('SCARD', missing) end
        for s = high + 1, slot - 1 do
          if n >= cap then redis.call('HSET', k, 'missing_overflow', '1'); break end
          n = n + redis.call('SADD', missing, s)  -- a slot already missing adds nothing
        end
        high = slot
      else
        local gone = redis.call('SREM', missing, slot)
        if n ~= nil then n = n - gone end
      end
    end
    if high ~= was then redis.call('HSET', k, 'high', high) end
  end
end
-- Failure counts of batches this commit moved past: a later failure there starts from one.
for _, batch in ipairs(a[17]) do redis.call('DEL', P .. 'fail:' .. batch) end
if #a[18] > 0 then variadic('SADD', P .. 'excluded', a[18], 1) end
if #a[19] > 0 then variadic('SREM', P .. 'excluded', a[19], 1) end
if newday then return {'OK', 1} end
return {'OK'}
"""
)

# ARGV[1]: msgpack [epoch or '', acked, revision, replace states (0/1), generation or '',
# progress pairs, state pairs, readmit, exclude, dead fields, their buckets, revision, today,
# expire_at, the oldest live day]; ARGV[2]: the partition's key prefix.
_REPLACE_FOLD = (
    _LUA_CLAIMS
    + """
local a = cmsgpack.unpack(ARGV[1])
local P = ARGV[2]
local newer = layout_refused(P .. 'layout', a[19])
if newer then return {'LAYOUT', tostring(newer)} end
local progress = P .. 'progress'
if a[1] ~= '' then
  local cur = redis.call('GET', P .. 'epoch') or '0'
  if cur ~= a[1] then return {'FENCED', cur} end
end
local at = redis.call('HMGET', progress, 'acked_through', 'cursor_revision', 'fold_generation')
local acked, rev, gen = at[1] or '-1', at[2] or '0', at[3] or '0'
if acked ~= a[2] or rev ~= a[3] or (a[5] ~= '' and gen ~= a[5]) then
  return {'MOVED', acked, rev}
end
if a[4] == 1 then redis.call('DEL', P .. 'state') end
if #a[6] > 0 then variadic('HSET', progress, a[6], 1) end
if #a[7] > 0 then variadic('HSET', P .. 'state', a[7], 1) end
if #a[8] > 0 then variadic('SREM', P .. 'excluded', a[8], 1) end
if #a[9] > 0 then variadic('SADD', P .. 'excluded', a[9], 1) end
local refs, marker = a[17], math.max(layout_of(P .. 'layout'), tonumber(a[20]))
if #a[10] > 0 then
  local dead = a[12] .. 'd'
  local function tok(i) return dead end
  local f, b, _, t, n = by_id_first(a[10], a[11], nil, tok, refs, #a[10], marker)
  f = head(f, n)
  if n > 0 then write_claims(P, a[13], a[15], a[14], a[16], f, b, t, nil, nil) end
end
if marker > layout_of(P .. 'layout') then redis.call('SET', P .. 'layout', marker) end
if a[21] == 1 then
  local cache = {}
  for i = 1, #a[10] do
    local ref = refs[i]
    if ref then
      local e = sc_open(P, a[12], cache, ref)
      sc_claim(e.r, ref[4], ref[5], true, a[18])
      e.dirty = true
    end
  end
  sc_flush(cache)
end
return {'OK'}
"""
)

# KEYS[1]: the partition's epoch, KEYS[2] its layout; ARGV[1]: the layout this release speaks.
# A script, not a bare INCR, so it can travel with a WAIT, and a release that must not write
# learns it as soon as it is given the partition.
_ACQUIRE = """
local found = tonumber(redis.call('GET', KEYS[2]) or '1')
if found > tonumber(ARGV[1]) then return {'LAYOUT', tostring(found)} end
return {'OK', redis.call('INCR', KEYS[1])}
"""

# KEYS: progress, epoch, state, pending, layout; ARGV: the epoch, the layout spoken.
_CLEAR_PENDING = """
local found = tonumber(redis.call('GET', KEYS[5]) or '1')
if found > tonumber(ARGV[2]) then return {'LAYOUT', tostring(found)} end
local cur = redis.call('GET', KEYS[2]) or '0'
if cur ~= ARGV[1] then return {'FENCED', cur} end
redis.call('DEL', KEYS[4])
redis.call('HSET', KEYS[1], 'pending_effects', '0')
return {'OK'}
"""


def _pack(value: object) -> bytes:
    # Redis's cmsgpack knows no bin type: bytes travel as raw strings, as Lua strings are.
    return msgpack.packb(value, use_bin_type=False)  # type: ignore[no-any-return]


def _arg(value: str | int | float) -> str:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value)


def claim_field(event_id: str) -> bytes:
    """A claim's field: the 16 id bytes of an ``evt_<32 hex>`` id, else ``~<id>\\0``."""
    if event_id.startswith("evt_") and len(event_id) == 36:
        try:
            return bytes.fromhex(event_id[4:])
        except ValueError:
            pass
    return b"~" + event_id.encode() + b"\x00"


def claim_bucket(field: bytes, buckets: int) -> int:
    """Which of a day's claim hashes holds this field. Both kinds of ``evt_`` id are random in
    every byte (a hash's digest, or random bytes), and the bucket takes the last four, so an id
    scheme with a time-ordered prefix would still spread; other ids take a CRC-32 (stable)."""
    if len(field) == 16:
        return int.from_bytes(field[12:], "big") % buckets
    return zlib.crc32(field) % buckets


def claim_member(event_id: str, revision: int, *, dead: bool = False) -> bytes:
    """A claim as the old layout's day sets held it: the field, then the revision in decimal
    (and ``d`` for an event that was dead-lettered rather than applied)."""
    return claim_field(event_id) + str(revision).encode() + (b"d" if dead else b"")


# -- coalescing effect ops -------------------------------------------------------------------

_FIELD_OPS = frozenset({"HSET", "HDEL", "HINCRBY", "HMAX", "SADD", "SREM"})
_INTEGER = re.compile(r"-?(0|[1-9][0-9]*)")
_NUMBER = re.compile(r"-?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?")
_INT64 = 2**63


def _text(value: str | int | float) -> str:
    return value if type(value) is str else _arg(value)


def _integer(value: str | int | float) -> int | None:
    """An HINCRBY's number when it is in plain form (Redis and Python read odd forms apart)."""
    if type(value) is int:
        return value
    text = _text(value)
    return int(text) if _INTEGER.fullmatch(text) else None


def _number(value: str | int | float) -> float | None:
    """An HMAX's number when it is in plain form (what Lua's tonumber reads the same)."""
    if type(value) is int:
        return float(value)
    text = _text(value)
    return float(text) if _NUMBER.fullmatch(text) else None


def coalesce(ops: Sequence[RedisOp]) -> list[list[str]]:
    """The ops as fewer calls with exactly the end state of applying them one by one.

    Ops commute when they touch different things: different keys, or different fields of one
    hash, or different members of one set (a list, a string, a DEL touch their key whole; SLOT
    its hash's ``high`` and ``missing_overflow`` and its missing-set whole). An op joins the
    latest run of its kind on its key when nothing after that run touches what it touches:
    HSETs become one HSET with every pair (the last value of a field wins), HDEL, SADD, SREM and
    RPUSH one call with every member in order, LPUSHTRIMs of one cap one LPUSH of every element
    and one LTRIM, HINCRBYs of one field their sum, HMAXes of one field the first of the largest
    values, SLOTs of one hash, missing set and cap one call with every slot in order (the script
    reads ``high`` and the missing count once). An HINCRBY or HMAX whose number is not in plain
    form is left alone, and a sum that would leave Redis's 64-bit range starts a new run (only ops
    that fail in Redis could end apart then)."""
    runs: list[tuple[str, str, list[str], dict[str, object] | list[str]]] = []
    touched: dict[str, int] = {}  # key -> the last run touching it at all
    whole: dict[str, int] = {}  # key -> the last run touching it whole
    part: dict[tuple[str, str], int] = {}  # (key, field or member) -> the last run touching it
    latest: dict[tuple[str, str, str], int] = {}  # (op, key, cap) -> its latest run
    for op in ops:
        kind, key, args = op.op, op.key, op.args
        if kind in _FIELD_OPS:
            name = _text(args[0])
            spot = (key, name)
            value: object = None
            if kind == "HSET":
                value = _text(args[1])
            elif kind == "HINCRBY":
                value = _integer(args[1])
            elif kind == "HMAX":
                value = _number(args[1])
            opaque = kind in ("HINCRBY", "HMAX") and value is None
            at = -1 if opaque else latest.get((kind, key, ""), -1)
            if at < 0 or at < whole.get(key, -1) or at < part.get(spot, -1):
                at = -1
            elif kind == "HINCRBY":
                pairs = runs[at][3]
                assert isinstance(pairs, dict)
                if name in pairs:
                    total = pairs[name] + value  # type: ignore[operator]
                    if not -_INT64 <= total < _INT64:
                        at = -1
                    else:
                        value = total
            if at < 0:
                at = len(runs)
                runs.append((kind, key, [], {}))
                if not opaque:
                    latest[(kind, key, "")] = at
            payload = runs[at][3]
            assert isinstance(payload, dict)
            if kind == "HMAX":
                if opaque:
                    payload[name] = (0.0, _text(args[1]))
                else:
                    have = payload.get(name)
                    if have is None or value > have[0]:  # type: ignore[index]
                        payload[name] = (value, _text(args[1]))
            elif kind in ("HDEL", "SADD", "SREM"):
                payload[name] = None
            elif kind == "HINCRBY" and opaque:
                payload[name] = _text(args[1])
            else:
                payload[name] = value
            part[spot] = at
            if touched.get(key, -1) < at:
                touched[key] = at
        elif kind in ("RPUSH", "LPUSHTRIM"):
            cap = _text(args[1]) if kind == "LPUSHTRIM" else ""
            at = latest.get((kind, key, cap), -1)
            if at < 0 or at < touched.get(key, -1):
                at = len(runs)
                runs.append((kind, key, [cap] if cap else [], []))
                latest[(kind, key, cap)] = at
            elements = runs[at][3]
            assert isinstance(elements, list)
            elements.append(_text(args[0]))
            touched[key] = whole[key] = at
        elif kind == "SLOT":
            missing, cap = _text(args[0]), _text(args[2])
            if missing == key:  # the hash is its own missing set: touched whole, joins nothing
                at = len(runs)
                runs.append((kind, key, [missing, cap], [_text(args[1])]))
                touched[key] = whole[key] = at
                continue
            run = (kind, key, f"{missing}\x00{cap}")
            at = latest.get(run, -1)
            if (
                at < 0
                or at < whole.get(key, -1)
                or at < part.get((key, "high"), -1)
                or at < part.get((key, "missing_overflow"), -1)
                or at < touched.get(missing, -1)
            ):
                at = len(runs)
                runs.append((kind, key, [missing, cap], []))
                latest[run] = at
            slots = runs[at][3]
            assert isinstance(slots, list)
            slots.append(_text(args[1]))
            part[(key, "high")] = part[(key, "missing_overflow")] = at
            touched[missing] = whole[missing] = at
            if touched.get(key, -1) < at:
                touched[key] = at
        elif kind in OPS:  # SET, INCRBY, DEL
            at = len(runs)
            runs.append((kind, key, [_text(a) for a in args], []))
            touched[key] = whole[key] = at
        else:
            raise ValueError(f"unknown Redis effect op {kind!r}")
    out: list[list[str]] = []
    for kind, key, extra, payload in runs:
        if isinstance(payload, list):
            out.append([kind, key, *extra, *payload])
        elif kind in ("HDEL", "SADD", "SREM"):
            out.append([kind, key, *payload])
        elif kind == "HMAX":
            out.append([kind, key, *(x for f, v in payload.items() for x in (f, v[1]))])  # type: ignore[index]
        else:
            out.append([kind, key, *(x for f, v in payload.items() for x in (f, str(v)))])
    return out


COALESCE_MIN_OPS_PER_KEY = 2  # effect_calls coalesces a commit's ops from this many a key on


def one_by_one(ops: Sequence[RedisOp]) -> list[list[str]]:
    """The ops as calls of the script, one each and in order: what :func:`coalesce` returns for
    ops that share no key."""
    out: list[list[str]] = []
    for op in ops:
        kind, args = op.op, op.args
        if kind == "LPUSHTRIM":  # the call takes its cap first, then the elements
            out.append([kind, op.key, _text(args[1]), _text(args[0])])
        elif kind == "SLOT":  # its missing set and cap, then the slot
            out.append([kind, op.key, _text(args[0]), _text(args[2]), _text(args[1])])
        elif kind in OPS:
            out.append([kind, op.key, *(_text(a) for a in args)])
        else:
            raise ValueError(f"unknown Redis effect op {kind!r}")
    return out


def effect_calls(ops: Sequence[RedisOp]) -> list[list[str]]:
    """A commit's effect ops as the script's calls: coalesced when they come back to their keys
    (COALESCE_MIN_OPS_PER_KEY or more ops a key), else one by one, which costs a fraction of
    coalescing ops that have nothing to join (a view per project over 100,000 projects:
    coalescing was a third of the projector's time there)."""
    if len(ops) >= COALESCE_MIN_OPS_PER_KEY * len({op.key for op in ops}):
        return coalesce(ops)
    return one_by_one(ops)


# -- the store --------------------------------------------------------------------------------


class RedisStore:
    def __init__(
        self,
        client: redis.Redis[bytes],
        *,
        env: str,
        slug: str,
        clock: Clock,
        claim_ttl_ms: int,
        failure_ttl_s: int = 7 * 86_400,
        claim_buckets: int = 1024,
        claim_project_buckets: int = 4,
        claim_gap_horizon: int = 1_000,
        wait: Wait | None = None,
        speaks: int = LAYOUT,
        writes_slot_claims: bool = WRITES_SLOT_CLAIMS,
    ) -> None:
        if claim_buckets < 1:
            raise ValueError(f"claim_buckets must be at least 1, not {claim_buckets}")
        if claim_project_buckets < 1:
            raise ValueError(
                f"claim_project_buckets must be at least 1, not {claim_project_buckets}"
            )
        self.client = client
        self.env = env
        self.slug = slug
        self.clock = clock
        self.claim_ttl_ms = claim_ttl_ms
        self.failure_ttl_s = failure_ttl_s
        self.claim_buckets = claim_buckets
        self.claim_project_buckets = claim_project_buckets
        self.claim_gap_horizon = claim_gap_horizon
        # The layout this store speaks, and whether it writes slot claims: a release's
        # (consumers.runtime.layout); an upgrade test runs an older release's with them.
        self.speaks = speaks
        self.writes_slot_claims = writes_slot_claims
        self._target: int | None = None  # the environment's layout, read at the first write
        # Every write script (acquire, commit, replace_fold, clear_pending) ends with this WAIT:
        # a commit fewer replicas acknowledged is refused as a redis-py error. The epoch too: a
        # failover that forgot an INCR would hand the new owner's epoch back to the old one.
        self.wait = wait
        self.days = math.ceil(claim_ttl_ms / DAY_MS) + 1
        # By partition prefix: (day, since when, today's claim hashes given their expiry).
        self._expired: dict[str, tuple[int, float, set[int]]] = {}
        self._scripts = {
            "decisions": Script(_DECISIONS),
            "commit": Script(_COMMIT),
            "replace": Script(_REPLACE_FOLD),
            "clear": Script(_CLEAR_PENDING),
            "acquire": Script(_ACQUIRE),
        }

    # -- keys ----------------------------------------------------------------------------------
    def prefix(self, tp: TP) -> str:
        return f"rh:{self.env}:{{{self.slug}|{tp.topic}|{tp.partition}}}:"

    def key(self, tp: TP, logical: str) -> str:
        return self.prefix(tp) + "x:" + logical

    def _core_keys(self, tp: TP) -> list[str]:
        p = self.prefix(tp)
        return [p + "progress", p + "epoch", p + "state", p + "pending", p + "layout"]

    def _layout_target(self) -> int:
        """The layout a partition is moved to at its next write: the environment's once
        ``state migrate --finalize`` set it (never above what this release speaks)."""
        if self._target is None:
            found = self.client.get(environment_key(self.env))
            self._target = min(int(found or 1), self.speaks)
        return self._target

    def _refs(self, event_ids: Sequence[str], slots: Slots) -> list[list[object] | bool]:
        """The slot refs the scripts take, aligned with ``event_ids`` (False: claimed by id)."""
        if not slots:
            return [False] * len(event_ids)
        n = self.claim_project_buckets
        out: list[list[object] | bool] = []
        for event_id in event_ids:
            ref: SlotRef | None = slots.get(event_id)
            if ref is None:
                out.append(False)
            else:
                bucket = slot_claims.bucket(ref.project, n)
                out.append([ref.outbox, bucket, ref.project, ref.slot, ref.fingerprint])
        return out

    def _layout_newer(self, tp: TP, found: bytes) -> LayoutNewer:
        return LayoutNewer(f"partition {tp} of {self.slug}", int(found), self.speaks)

    def _today(self) -> int:
        return int(self.clock.now().timestamp() * 1000) // DAY_MS

    def _claims_expire_at(self) -> int:
        """Today's claim buckets live until the stream's retention plus a margin is over."""
        return (self._today() + 1) * DAY_MS // 1000 + self.claim_ttl_ms // 1000

    def _days(self) -> list[int]:
        """Every day whose claims may still be live: today first (the day written), then
        tomorrow, then the days before, the oldest last. Tomorrow because a clock stepped back
        across midnight (NTP, a restored VM) leaves claims written in the day ahead; not looked
        in, a copy of their events would be applied again."""
        today = self._today()
        return [today, today + 1, *(today - n for n in range(1, self.days))]

    def _claim_fields(self, event_ids: Iterable[str]) -> tuple[list[bytes], list[int]]:
        fields = [claim_field(e) for e in event_ids]
        n = self.claim_buckets
        return fields, [claim_bucket(f, n) for f in fields]

    # -- scripts in a pipeline -----------------------------------------------------------------
    def _run_all(self, name: str, calls: Sequence[tuple[str, bytes]]) -> list[object]:
        """One script per (partition prefix, packed argument), all in one pipeline; answers in
        order (see run_script_calls)."""
        return run_script_calls(
            self.client,
            self._scripts[name],
            [([prefix + "progress"], [packed, prefix]) for prefix, packed in calls],
            wait=None if name == "decisions" else self.wait,
        )

    # -- Store ---------------------------------------------------------------------------------
    def acquire(self, tp: TP) -> int:
        p = self.prefix(tp)
        (answer,) = run_script_calls(
            self.client,
            self._scripts["acquire"],
            [([p + "epoch", p + "layout"], [str(self.speaks)])],
            wait=self.wait,
        )
        assert isinstance(answer, list)
        if answer[0] == b"LAYOUT":
            raise self._layout_newer(tp, answer[1])
        return int(answer[1])

    def epoch(self, tp: TP) -> int:
        return int(self.client.get(self.prefix(tp) + "epoch") or 0)

    def load(self, tp: TP) -> Progress:
        return Progress.from_fields(self.client.hgetall(self.prefix(tp) + "progress"))

    def claimed(
        self,
        tp: TP,
        revision: int,
        event_ids: Sequence[str],
        *,
        dead: bool = False,
        slots: Slots = NO_SLOTS,
    ) -> set[str]:
        found = self.decisions(tp, revision, event_ids, slots)
        return found.dead if dead else found.applied

    def decisions(
        self, tp: TP, revision: int, event_ids: Sequence[str], slots: Slots = NO_SLOTS
    ) -> Decisions:
        return self.decisions_many([(tp, revision, event_ids)], slots)[0]

    def decisions_many(
        self, asks: Sequence[tuple[TP, int, Sequence[str]]], slots: Slots = NO_SLOTS
    ) -> list[Decisions]:
        days = self._days()
        calls: list[tuple[str, bytes]] = []
        asked: list[int] = []
        for n, (tp, revision, event_ids) in enumerate(asks):
            if event_ids:
                fields, subs = self._claim_fields(event_ids)
                refs = self._refs(event_ids, slots)
                calls.append((self.prefix(tp), _pack([str(revision), days, fields, subs, refs])))
                asked.append(n)
        out = [Decisions(set(), set(), set()) for _ in asks]
        for n, answer in zip(asked, self._run_all("decisions", calls), strict=True):
            assert isinstance(answer, bytes)
            applied, dead, conflicts = out[n]
            for event_id, digit in zip(asks[n][2], answer, strict=True):
                code = digit - 48
                if code & 1:
                    applied.add(event_id)
                if code & 2:
                    dead.add(event_id)
                if code & 4:
                    conflicts.add(event_id)
        return out

    def states(self, tp: TP, projects: Iterable[str]) -> dict[str, JSON | None]:
        projects = list(projects)
        if not projects:
            return {}
        values = self.client.hmget(self.prefix(tp) + "state", projects)
        return {p: (orjson.loads(v) if v else None) for p, v in zip(projects, values, strict=True)}

    def all_states(self, tp: TP) -> dict[str, JSON]:
        return {
            k.decode(): orjson.loads(v)
            for k, v in self.client.hgetall(self.prefix(tp) + "state").items()
        }

    def _unexpired(self, prefix: str, day: int, subs: list[int]) -> list[int]:
        """Which of today's claim hashes in ``subs`` this store has not given their expiry yet
        (remembered for EXPIRY_MEMORY_S: a hash deleted and written again since, by a Redis
        that lost data or evicted it, gets its expiry at its next commit after that)."""
        now = self.clock.monotonic()
        memory = self._expired.get(prefix)
        if memory is None or memory[0] != day or now - memory[1] > EXPIRY_MEMORY_S:
            memory = self._expired[prefix] = (day, now, set())
        done = memory[2]
        return [b for b in dict.fromkeys(subs) if b not in done]

    def _packed(self, commit: Commit, days: list[int], expire_at: int) -> tuple[bytes, list[int]]:
        """The commit script's argument, and today's claim hashes it gives their expiry."""
        claims = list(dict.fromkeys(commit.claims))
        dead = list(dict.fromkeys(commit.dead_claims))
        nclaim = len(claims) + len(dead)
        unclaimed = [] if commit.looked else commit.unclaimed
        fields, subs = self._claim_fields(claims + dead + unclaimed)
        refs = self._refs(claims + dead + unclaimed, commit.slots)
        # Today's hashes this commit writes claims by id into: once finalized, not those of its
        # outbox events (claimed by slot alone), so none is remembered as given its expiry
        # without having been written.
        finalized = self._layout_target() >= 2
        by_id = [
            sub
            for sub, ref in zip(subs[:nclaim], refs[:nclaim], strict=True)
            if not (ref and finalized)
        ]
        expire = self._unexpired(self.prefix(commit.tp), days[0], by_id) if by_id else []
        sets: list[str | bytes] = []
        deletes: list[str] = []
        for project, state in commit.states.items():
            if state is None:
                deletes.append(project)
            else:
                encoded = orjson.dumps(state)
                sets += [project, encoded]
                commit.state_bytes[project] = len(encoded)
        return _pack(
            [
                str(commit.epoch),
                str(commit.expected_acked),
                str(commit.expected_revision),
                str(commit.progress.fold_generation),
                1 if commit.pending is not None else 0,
                expire_at,
                days,
                fields,
                subs,
                len(claims),
                str(commit.progress.cursor_revision),
                [x for kv in commit.progress.as_fields().items() for x in kv],
                sets,
                deletes,
                encode_pending(commit.pending) if commit.pending is not None else b"",
                effect_calls(commit.redis),
                list(commit.cleared_failures),
                [str(o) for o in commit.excluded_add],
                [str(o) for o in commit.excluded_remove],
                1 if commit.looked else 0,
                expire,
                self.claim_buckets,
                nclaim,
                refs,
                self.claim_gap_horizon,
                str(self.speaks),
                str(self._layout_target()),
                1 if self.writes_slot_claims else 0,
                [r for r in self._refs(commit.passed, commit.slots) if r],
            ]
        ), expire

    def commit(self, commit: Commit) -> None:
        refused = self.commit_many([commit])[0]
        if refused is not None:
            raise refused

    def commit_many(self, commits: Sequence[Commit]) -> list[Exception | None]:
        days = self._days()
        expire_at = self._claims_expire_at()
        packed = [self._packed(c, days, expire_at) for c in commits]
        answers = self._run_all(
            "commit",
            [(self.prefix(c.tp), arg) for c, (arg, _) in zip(commits, packed, strict=True)],
        )
        refusals: list[Exception | None] = []
        for c, answer in zip(commits, answers, strict=True):
            if isinstance(answer, list) and answer[0] == b"LAYOUT":
                raise self._layout_newer(c.tp, answer[1])
        for c, (_, expire), answer in zip(commits, packed, answers, strict=True):
            assert isinstance(answer, list)
            refusal = _refusal(c.tp, c, answer)
            refusals.append(refusal)
            if refusal is None and expire:
                prefix = self.prefix(c.tp)
                day, since, done = self._expired[prefix]
                if len(answer) > 1:  # today was new to the partition (Redis lost the days?)
                    done = set()
                    self._expired[prefix] = (day, since, done)
                done.update(expire)
        return refusals

    def pending(self, tp: TP) -> list[OutRecord]:
        return decode_pending(self.client.get(self.prefix(tp) + "pending") or b"")

    def clear_pending(self, tp: TP, epoch: int) -> None:
        (result,) = run_script_calls(
            self.client,
            self._scripts["clear"],
            [(self._core_keys(tp), [str(epoch), str(self.speaks)])],
            wait=self.wait,
        )
        if result[0] == b"LAYOUT":
            raise self._layout_newer(tp, result[1])
        if result[0] == b"FENCED":
            raise Fenced(tp, epoch, int(result[1] or 0))

    def replace_fold(
        self,
        tp: TP,
        epoch: int | None,
        expected: tuple[int, int],
        progress: Progress,
        states: dict[str, JSON] | None,
        expected_generation: int | None = None,
        exclude: Sequence[int] = (),
        readmit: Sequence[int] = (),
        dead_claims: Sequence[str] = (),
        slots: Slots = NO_SLOTS,
    ) -> None:
        dead_ids = list(dict.fromkeys(dead_claims))
        fields, subs = self._claim_fields(dead_ids)
        packed = _pack(
            [
                "" if epoch is None else str(epoch),
                str(expected[0]),
                str(expected[1]),
                1 if states is not None else 0,
                "" if expected_generation is None else str(expected_generation),
                [x for kv in progress.as_fields().items() for x in kv],
                [x for p, s in (states or {}).items() for x in (p, orjson.dumps(s))],
                [str(o) for o in readmit],
                [str(o) for o in exclude],
                fields,
                subs,
                str(progress.cursor_revision),
                self._today(),
                self._claims_expire_at(),
                self._days()[-1],
                self.claim_buckets,
                self._refs(dead_ids, slots),
                self.claim_gap_horizon,
                str(self.speaks),
                str(self._layout_target()),
                1 if self.writes_slot_claims else 0,
            ]
        )
        (result,) = self._run_all("replace", [(self.prefix(tp), packed)])
        assert isinstance(result, list)
        status = result[0].decode()
        if status == "LAYOUT":
            raise self._layout_newer(tp, result[1])
        if status == "FENCED":
            raise Fenced(tp, epoch or -1, int(result[1] or 0))
        if status == "MOVED":
            raise CursorMoved(tp, expected, (int(result[1]), int(result[2])))

    def _excluded_key(self, tp: TP) -> str:
        return self.prefix(tp) + "excluded"

    def excluded(self, tp: TP) -> set[int]:
        return {int(o) for o in self.client.smembers(self._excluded_key(tp))}

    def _failure_key(self, tp: TP, batch_key: str) -> str:
        return f"{self.prefix(tp)}fail:{batch_key}"

    def count_failure(self, tp: TP, batch_key: str) -> int:
        key = self._failure_key(tp, batch_key)
        pipe = self.client.pipeline()
        pipe.incr(key)
        pipe.expire(key, self.failure_ttl_s)
        count, _ = pipe.execute()
        return int(count)

    def clear_failures(self, tp: TP, batch_key: str) -> None:
        self.client.delete(self._failure_key(tp, batch_key))

    def read(self, tp: TP, key: str) -> object:
        return read_key(self.client, self.key(tp, key))


def _refusal(tp: TP, commit: Commit, result: list[bytes]) -> Exception | None:
    """The commit script's answer as None (applied) or the refusal (nothing written)."""
    status = result[0].decode()
    if status == "OK":
        return None
    if status == "FENCED":
        return Fenced(tp, commit.epoch, int(result[1] or 0))
    if status == "MOVED":
        expected = (commit.expected_acked, commit.expected_revision)
        return CursorMoved(tp, expected, (int(result[1]), int(result[2])))
    if status == "PENDING":
        return PendingEffects(tp)
    if status == "CLAIMS":
        return ClaimsFound(tp)
    if status == "CLAIMED":
        # A claim appeared that this owner did not see when it read: treat as a moved cursor.
        expected = (commit.expected_acked, commit.expected_revision)
        return CursorMoved(tp, expected, expected)
    raise RuntimeError(f"unexpected answer from the commit script: {result!r}")


def read_key(client: redis.Redis[bytes], full: str) -> object:
    kind = client.type(full).decode()
    if kind == "hash":
        return {k.decode(): v.decode() for k, v in client.hgetall(full).items()}
    if kind == "set":
        return {m.decode() for m in client.smembers(full)}
    if kind == "list":
        return [m.decode() for m in client.lrange(full, 0, -1)]
    if kind == "string":
        value = client.get(full)
        return value.decode() if value is not None else None
    return None
