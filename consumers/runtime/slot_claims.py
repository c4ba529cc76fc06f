"""Claims of outbox events, kept per (outbox, project, cursor revision) as slots, not event ids.

An outbox numbers each project's events 1, 2, 3 … (its ``slot``), with no gaps and no reuse, and
its ``UNIQUE`` constraint allows one event per slot. So a subscription's claims on one project's
events from one outbox shrink to a few numbers, whatever the number of events:

- ``base``: every slot up to it is handled (applied or dead-lettered), except the ``missing``
  ranges below it;
- ``above``: handled slots past ``base + 1`` (a gap below them: a row still parked in the outbox,
  published late, or events not seen since a ``reprocess_from`` started this revision at 0), as
  disjoint ranges;
- ``dead``: the handled slots that were dead-lettered, not applied (a later copy is a duplicate
  of the letter; an operator's retry applies it and it leaves this list);
- ``prints``: a fingerprint of the event id at each handled slot above ``base``, so a copy of a
  *different* event at a claimed slot (two outboxes mistaken for one, a restored database that
  numbers slots again) is told apart from a duplicate and dead-lettered as a conflict. At or below
  ``base`` the outbox's constraint rules that out, and nothing is kept;
- ``missing``: gaps that stayed open while ``horizon`` more slots were handled above them are
  moved below ``base`` as ranges, so a gap that never closes costs one range, not a fingerprint
  for every event after it; a late event inside one is applied and shrinks it.

In steady state a record is its base alone, written in decimal, which Redis keeps as an integer. :class:`SlotClaims` is the one
implementation in Python (the memory store's, and the property tests' model checks it); the Lua
of ``redis_store`` mirrors it on the same encoding, held to it by the store contract tests.
"""

from __future__ import annotations

import bisect
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field

import msgpack  # type: ignore[import-untyped]

from streams.envelopes import Event
from streams.outbox.identity import outbox_position

# Verdicts, as bits (the Redis lookup answers the same digits).
NONE, APPLIED, DEAD, CONFLICT = 0, 1, 2, 4

# The longest record kept in its bucket's small hash (below Redis' hash-max-listpack-value, 64
# bytes by default): see LUA.
INLINE_BYTES = 60


@dataclass(frozen=True, slots=True)
class SlotRef:
    """Where an outbox event sits: its outbox, project and slot, and its id's fingerprint."""

    outbox: str
    project: str
    slot: int
    fingerprint: int

    @classmethod
    def of(cls, outbox: str, project: str, slot: int, event_id: str) -> SlotRef:
        return cls(outbox, project, slot, fingerprint(event_id))


def slot_ref(headers: Iterable[tuple[str, bytes]] | None, event: Event) -> SlotRef | None:
    """Where a record's event sits in its outbox, or None (claimed by id): no ``outbox`` header
    or a malformed one, or no slot."""
    position = outbox_position(headers, event)
    if position is None:
        return None
    return SlotRef.of(position.outbox_id, event.project_id, position.slot, event.event_id)


def bucket(project: str, buckets: int) -> int:
    """Which of an outbox's ``buckets`` small hashes holds the project's record."""
    return zlib.crc32(project.encode()) % buckets


def fingerprint(event_id: str) -> int:
    """32 bits of the event id, enough to tell two events apart at one slot (a collision makes a
    conflict look like a duplicate, 1 in 4 billion, and only within ``horizon`` of a gap)."""
    return zlib.crc32(event_id.encode())


@dataclass
class SlotClaims:
    base: int = 0
    above: list[int] = field(default_factory=list)  # flat [lo, hi, lo, hi …], lo > base + 1
    dead: list[int] = field(default_factory=list)  # sorted
    missing: list[int] = field(default_factory=list)  # flat ranges, all <= base
    prints: dict[int, int] = field(default_factory=dict)  # slot > base -> fingerprint

    # -- reading ------------------------------------------------------------------------------
    def handled(self, slot: int) -> bool:
        if slot <= self.base:
            return not _in_ranges(self.missing, slot)
        return _in_ranges(self.above, slot)

    def verdict(self, slot: int, print_: int) -> int:
        """NONE (not claimed), APPLIED, DEAD (dead-lettered), or CONFLICT (another event holds
        this slot)."""
        if not self.handled(slot):
            return NONE
        held = self.prints.get(slot)
        if held is not None and held != print_:
            return CONFLICT
        return DEAD if _in_sorted(self.dead, slot) else APPLIED

    # -- writing ------------------------------------------------------------------------------
    def claim(self, slot: int, print_: int, *, dead: bool, horizon: int) -> None:
        """Record ``slot`` as applied (or dead-lettered). Applying a dead-lettered slot (an
        operator's retry) takes it out of ``dead``; dead-lettering an applied one changes
        nothing (the first decision stands, as with claims by id)."""
        if self.handled(slot):
            if not dead:
                _remove_sorted(self.dead, slot)
            return
        if dead:
            bisect.insort(self.dead, slot)
        if slot <= self.base:
            self.missing = _ranges_without(self.missing, slot)
            return
        self.above = _ranges_with(self.above, slot)
        self.prints[slot] = print_
        while self.above and self.above[0] == self.base + 1:
            self.base = self.above[1]
            del self.above[:2]
        # A gap open while ``horizon`` slots were handled past it moves below the base.
        while self.above and self.above[-1] - self.base > horizon:
            self.missing = _ranges_join(self.missing, self.base + 1, self.above[0] - 1)
            self.base = self.above[1]
            del self.above[:2]
        if self.prints and min(self.prints) <= self.base:
            self.prints = {s: p for s, p in self.prints.items() if s > self.base}

    # -- encoding -----------------------------------------------------------------------------
    def encode(self) -> bytes:
        parts: list[object] = [
            self.base,
            self.above,
            self.dead,
            self.missing,
            [x for s in sorted(self.prints) for x in (s, self.prints[s])],
        ]
        while len(parts) > 1 and not parts[-1]:
            parts.pop()
        if len(parts) == 1:
            # Digits alone: Redis keeps a hash value that reads as an integer as one, in a
            # listpack a few bytes; a msgpack array never starts with a digit.
            return str(self.base).encode()
        return msgpack.packb(parts)  # type: ignore[no-any-return]

    @classmethod
    def decode(cls, blob: bytes | None) -> SlotClaims:
        if not blob:
            return cls()
        if blob[:1].isdigit():
            return cls(base=int(blob))
        parts = msgpack.unpackb(blob)
        parts += [[]] * (5 - len(parts))
        flat = parts[4]
        return cls(
            base=parts[0],
            above=list(parts[1]),
            dead=list(parts[2]),
            missing=list(parts[3]),
            prints={flat[i]: flat[i + 1] for i in range(0, len(flat), 2)},
        )


def _in_sorted(items: list[int], x: int) -> bool:
    i = bisect.bisect_left(items, x)
    return i < len(items) and items[i] == x


def _remove_sorted(items: list[int], x: int) -> None:
    i = bisect.bisect_left(items, x)
    if i < len(items) and items[i] == x:
        del items[i]


def _in_ranges(flat: list[int], x: int) -> bool:
    for i in range(0, len(flat), 2):
        if flat[i] <= x <= flat[i + 1]:
            return True
        if flat[i] > x:
            return False
    return False


def _ranges_with(flat: list[int], x: int) -> list[int]:
    """``flat`` with ``x`` added, ranges merged where they touch."""
    return _ranges_join(flat, x, x)


def _ranges_join(flat: list[int], lo: int, hi: int) -> list[int]:
    out: list[int] = []
    placed = False
    for i in range(0, len(flat), 2):
        a, b = flat[i], flat[i + 1]
        if b + 1 < lo:
            out += [a, b]
        elif hi + 1 < a:
            if not placed:
                out += [lo, hi]
                placed = True
            out += [a, b]
        else:
            lo, hi = min(lo, a), max(hi, b)
    if not placed:
        out += [lo, hi]
    return out


def _ranges_without(flat: list[int], x: int) -> list[int]:
    out: list[int] = []
    for i in range(0, len(flat), 2):
        a, b = flat[i], flat[i + 1]
        if a <= x <= b:
            if a < x:
                out += [a, x - 1]
            if x < b:
                out += [x + 1, b]
        else:
            out += [a, b]
    return out


# The same record in the Redis scripts (redis_store), on the same encoding. A script opens each
# (revision, outbox, project) record once (sc_open), works on it in Lua, and writes the changed
# ones back once (sc_flush). A record too long to stay inside a small hash (Redis keeps a hash of
# values up to hash-max-listpack-value, 64 bytes by default, packed; one longer value turns the
# whole hash into a table for good) lives in the outbox's overflow hash, ``…:x``, and its
# bucket's field holds ``*``.
LUA = (
    f"local SC_INLINE = {INLINE_BYTES}\n"
    + """
local function sc_in_ranges(f, x)
  for i = 1, #f, 2 do
    if f[i] <= x and x <= f[i + 1] then return true end
    if f[i] > x then return false end
  end
  return false
end
local function sc_join(f, lo, hi)
  local out, placed = {}, false
  for i = 1, #f, 2 do
    local a, b = f[i], f[i + 1]
    if b + 1 < lo then
      out[#out + 1] = a; out[#out + 1] = b
    elseif hi + 1 < a then
      if not placed then out[#out + 1] = lo; out[#out + 1] = hi; placed = true end
      out[#out + 1] = a; out[#out + 1] = b
    else
      if a < lo then lo = a end
      if b > hi then hi = b end
    end
  end
  if not placed then out[#out + 1] = lo; out[#out + 1] = hi end
  return out
end
local function sc_without(f, x)
  local out = {}
  for i = 1, #f, 2 do
    local a, b = f[i], f[i + 1]
    if a <= x and x <= b then
      if a < x then out[#out + 1] = a; out[#out + 1] = x - 1 end
      if x < b then out[#out + 1] = x + 1; out[#out + 1] = b end
    else
      out[#out + 1] = a; out[#out + 1] = b
    end
  end
  return out
end
local function sc_find(t, x)
  for i = 1, #t do
    if t[i] == x then return i end
    if t[i] > x then return nil end
  end
  return nil
end
local function sc_decode(v)
  local r = {base = 0, above = {}, dead = {}, missing = {}, prints = {}}
  if not v then return r end
  local c = string.byte(v, 1)
  if c >= 48 and c <= 57 then r.base = tonumber(v); return r end
  local p = cmsgpack.unpack(v)
  r.base = p[1]; r.above = p[2] or {}; r.dead = p[3] or {}; r.missing = p[4] or {}
  local fl = p[5] or {}
  for i = 1, #fl, 2 do r.prints[fl[i]] = fl[i + 1] end
  return r
end
local function sc_encode(r)
  local slots, fl = {}, {}
  for s in pairs(r.prints) do slots[#slots + 1] = s end
  table.sort(slots)
  for _, s in ipairs(slots) do fl[#fl + 1] = s; fl[#fl + 1] = r.prints[s] end
  local parts = {r.base, r.above, r.dead, r.missing, fl}
  local n = 5
  while n > 1 and #parts[n] == 0 do parts[n] = nil; n = n - 1 end
  if n == 1 then return string.format('%d', r.base) end
  return cmsgpack.pack(parts)
end
local function sc_handled(r, s)
  if s <= r.base then return not sc_in_ranges(r.missing, s) end
  return sc_in_ranges(r.above, s)
end
-- 0 none, 1 applied, 2 dead-lettered, 4 another event holds the slot.
local function sc_verdict(r, s, fp)
  if not sc_handled(r, s) then return 0 end
  local held = r.prints[s]
  if held and held ~= fp then return 4 end
  if sc_find(r.dead, s) then return 2 end
  return 1
end
local function sc_claim(r, s, fp, dead, horizon)
  if sc_handled(r, s) then
    if not dead then
      local i = sc_find(r.dead, s)
      if i then table.remove(r.dead, i) end
    end
    return
  end
  if dead then
    local i = 1
    while i <= #r.dead and r.dead[i] < s do i = i + 1 end
    table.insert(r.dead, i, s)
  end
  if s <= r.base then r.missing = sc_without(r.missing, s); return end
  r.above = sc_join(r.above, s, s)
  r.prints[s] = fp
  while #r.above > 0 and r.above[1] == r.base + 1 do
    r.base = r.above[2]; table.remove(r.above, 1); table.remove(r.above, 1)
  end
  while #r.above > 0 and r.above[#r.above] - r.base > horizon do
    r.missing = sc_join(r.missing, r.base + 1, r.above[1] - 1)
    r.base = r.above[2]; table.remove(r.above, 1); table.remove(r.above, 1)
  end
  for k in pairs(r.prints) do if k <= r.base then r.prints[k] = nil end end
end
-- ref: {outbox, bucket, project, slot, fingerprint}
local function sc_open(P, rev, cache, ref)
  local k = P .. 'sc:' .. rev .. ':' .. ref[1] .. ':' .. ref[2]
  local id = k .. '|' .. ref[3]
  local e = cache[id]
  if not e then
    local x = P .. 'sc:' .. rev .. ':' .. ref[1] .. ':x'
    local v = redis.call('HGET', k, ref[3])
    local big = v == '*'
    if big then v = redis.call('HGET', x, ref[3]) end
    e = {k = k, x = x, project = ref[3], r = sc_decode(v), big = big, dirty = false}
    cache[id] = e
  end
  return e
end
local function sc_flush(cache)
  for _, e in pairs(cache) do
    if e.dirty then
      local blob = sc_encode(e.r)
      if #blob <= SC_INLINE then
        redis.call('HSET', e.k, e.project, blob)
        if e.big then redis.call('HDEL', e.x, e.project) end
      else
        redis.call('HSET', e.k, e.project, '*')
        redis.call('HSET', e.x, e.project, blob)
      end
    end
  end
end
"""
)
