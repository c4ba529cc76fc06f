"""The Store in Redis: one Lua script commits claims, effects, fold state, pending Kafka effects
and the cursor together, after checking the owner epoch (a zombie cannot write) and
compare-and-setting the cursor.

Every key of one (subscription, partition) carries the same hash tag,
``rh:<env>:{<slug>|<topic>|<partition>}:…``, so a script never spans hash slots and Redis can be
sharded by partition.

Claims are set members ``<16 raw id bytes><cursor revision>`` in one set per day, expiring a day
after the stream's retention plus a margin (Redis 7.0 has no per-field TTL, so whole buckets
expire); a claim check looks in every live bucket.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import orjson
import redis

from consumers.runtime.store import OPS, Commit, decode_pending, encode_pending
from consumers.runtime.types import JSON, TP, OutRecord, Progress
from streams.clock import Clock
from streams.errors import CursorMoved, Fenced, PendingEffects

DAY_MS = 86_400_000

_COMMIT = """
local cur = redis.call('GET', KEYS[2]) or '0'
if cur ~= ARGV[1] then return {'FENCED', cur} end
local acked = redis.call('HGET', KEYS[1], 'acked_through') or '-1'
local rev = redis.call('HGET', KEYS[1], 'cursor_revision') or '0'
local gen = redis.call('HGET', KEYS[1], 'fold_generation') or '0'
if acked ~= ARGV[2] or rev ~= ARGV[3] or gen ~= ARGV[7] then return {'MOVED', acked, rev} end
-- New pending Kafka effects must never replace ones not yet known to be published.
if ARGV[6] == '1' and redis.call('EXISTS', KEYS[4]) == 1 then return {'PENDING'} end
local expire_at = tonumber(ARGV[4])
local nb = tonumber(ARGV[5])
local i = 8
local nclaims = tonumber(ARGV[i]); i = i + 1
local first_claim = i
-- Claims go in chunks: one SMISMEMBER per bucket per chunk, well under Lua's stack limit.
local CHUNK = 1000
for c = 0, nclaims - 1, CHUNK do
  local last = math.min(c + CHUNK, nclaims) - 1
  for b = 0, nb - 1 do
    local hits = redis.call('SMISMEMBER', KEYS[5 + b], unpack(ARGV, first_claim + c, first_claim + last))
    for h = 1, #hits do
      if hits[h] == 1 then return {'CLAIMED', ARGV[first_claim + c + h - 1]} end
    end
  end
end
i = first_claim + nclaims
-- Every check passed: from here on the script only writes.
if nclaims > 0 then
  for c = 0, nclaims - 1, CHUNK do
    local last = math.min(c + CHUNK, nclaims) - 1
    redis.call('SADD', KEYS[5], unpack(ARGV, first_claim + c, first_claim + last))
  end
  redis.call('EXPIREAT', KEYS[5], expire_at)
end
local nf = tonumber(ARGV[i]); i = i + 1
for f = 1, nf do redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]); i = i + 2 end
local ns = tonumber(ARGV[i]); i = i + 1
for s = 1, ns do
  if ARGV[i + 1] == '' then redis.call('HDEL', KEYS[3], ARGV[i])
  else redis.call('HSET', KEYS[3], ARGV[i], ARGV[i + 1]) end
  i = i + 2
end
if ARGV[6] == '1' then redis.call('SET', KEYS[4], ARGV[i]) end
i = i + 1
local nops = tonumber(ARGV[i]); i = i + 1
for o = 1, nops do
  local name = ARGV[i]; local nk = tonumber(ARGV[i + 1]); i = i + 2
  local k = {}
  for j = 1, nk do k[j] = KEYS[tonumber(ARGV[i])]; i = i + 1 end
  local na = tonumber(ARGV[i]); i = i + 1
  local a = {}
  for j = 1, na do a[j] = ARGV[i]; i = i + 1 end
  if name == 'HSET' then redis.call('HSET', k[1], a[1], a[2])
  elseif name == 'HDEL' then redis.call('HDEL', k[1], a[1])
  elseif name == 'HINCRBY' then redis.call('HINCRBY', k[1], a[1], a[2])
  elseif name == 'HMAX' then
    local c = redis.call('HGET', k[1], a[1])
    if (not c) or tonumber(a[2]) > tonumber(c) then redis.call('HSET', k[1], a[1], a[2]) end
  elseif name == 'SET' then redis.call('SET', k[1], a[1])
  elseif name == 'INCRBY' then redis.call('INCRBY', k[1], a[1])
  elseif name == 'SADD' then redis.call('SADD', k[1], a[1])
  elseif name == 'SREM' then redis.call('SREM', k[1], a[1])
  elseif name == 'RPUSH' then redis.call('RPUSH', k[1], a[1])
  elseif name == 'LPUSHTRIM' then
    redis.call('LPUSH', k[1], a[1]); redis.call('LTRIM', k[1], 0, tonumber(a[2]) - 1)
  elseif name == 'DEL' then redis.call('DEL', k[1])
  elseif name == 'SLOT' then
    local slot = tonumber(a[1]); local cap = tonumber(a[2])
    local high = tonumber(redis.call('HGET', k[1], 'high') or '0')
    if slot > high then
      local n = redis.call('SCARD', k[2])
      for s = high + 1, slot - 1 do
        if n >= cap then redis.call('HSET', k[1], 'missing_overflow', '1'); break end
        redis.call('SADD', k[2], s); n = n + 1
      end
      redis.call('HSET', k[1], 'high', slot)
    else
      redis.call('SREM', k[2], slot)
    end
  end
end
-- Failure counts of batches this commit moved past: a later failure there starts from one.
local nclear = tonumber(ARGV[i]); i = i + 1
for c = 1, nclear do redis.call('DEL', KEYS[tonumber(ARGV[i])]); i = i + 1 end
local excluded = KEYS[tonumber(ARGV[i])]; i = i + 1
local nadd = tonumber(ARGV[i]); i = i + 1
for a = 1, nadd do redis.call('SADD', excluded, ARGV[i]); i = i + 1 end
local nrem = tonumber(ARGV[i]); i = i + 1
for r = 1, nrem do redis.call('SREM', excluded, ARGV[i]); i = i + 1 end
return {'OK'}
"""

_REPLACE_FOLD = """
if ARGV[1] ~= '' then
  local cur = redis.call('GET', KEYS[2]) or '0'
  if cur ~= ARGV[1] then return {'FENCED', cur} end
end
local acked = redis.call('HGET', KEYS[1], 'acked_through') or '-1'
local rev = redis.call('HGET', KEYS[1], 'cursor_revision') or '0'
local gen = redis.call('HGET', KEYS[1], 'fold_generation') or '0'
if acked ~= ARGV[2] or rev ~= ARGV[3] or (ARGV[5] ~= '' and gen ~= ARGV[5]) then
  return {'MOVED', acked, rev}
end
if ARGV[4] == '1' then redis.call('DEL', KEYS[3]) end
local i = 6
local nf = tonumber(ARGV[i]); i = i + 1
for f = 1, nf do redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]); i = i + 2 end
local ns = tonumber(ARGV[i]); i = i + 1
for s = 1, ns do redis.call('HSET', KEYS[3], ARGV[i], ARGV[i + 1]); i = i + 2 end
local nr = tonumber(ARGV[i]); i = i + 1
for r = 1, nr do redis.call('SREM', KEYS[5], ARGV[i]); i = i + 1 end
local nx = tonumber(ARGV[i]); i = i + 1
for x = 1, nx do redis.call('SADD', KEYS[5], ARGV[i]); i = i + 1 end
local nc = tonumber(ARGV[i]); i = i + 1
if nc > 0 then
  for c = 1, nc do redis.call('SADD', KEYS[6], ARGV[i]); i = i + 1 end
  redis.call('EXPIREAT', KEYS[6], tonumber(ARGV[i]))
end
return {'OK'}
"""

_CLEAR_PENDING = """
local cur = redis.call('GET', KEYS[2]) or '0'
if cur ~= ARGV[1] then return {'FENCED', cur} end
redis.call('DEL', KEYS[4])
redis.call('HSET', KEYS[1], 'pending_effects', '0')
return {'OK'}
"""


def _arg(value: str | int | float) -> str:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value)


def claim_member(event_id: str, revision: int, *, dead: bool = False) -> bytes:
    """Compact: the 16 id bytes, then the revision in decimal (and ``d`` for an event that
    was dead-lettered rather than applied)."""
    suffix = str(revision).encode() + (b"d" if dead else b"")
    if event_id.startswith("evt_") and len(event_id) == 36:
        try:
            return bytes.fromhex(event_id[4:]) + suffix
        except ValueError:
            pass
    return b"~" + event_id.encode() + b"\x00" + suffix


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
    ) -> None:
        self.client = client
        self.env = env
        self.slug = slug
        self.clock = clock
        self.claim_ttl_ms = claim_ttl_ms
        self.failure_ttl_s = failure_ttl_s
        self.buckets = math.ceil(claim_ttl_ms / DAY_MS) + 1
        self._commit = client.register_script(_COMMIT)
        self._replace = client.register_script(_REPLACE_FOLD)
        self._clear = client.register_script(_CLEAR_PENDING)

    # -- keys ----------------------------------------------------------------------------------
    def prefix(self, tp: TP) -> str:
        return f"rh:{self.env}:{{{self.slug}|{tp.topic}|{tp.partition}}}:"

    def key(self, tp: TP, logical: str) -> str:
        return self.prefix(tp) + "x:" + logical

    def _core_keys(self, tp: TP) -> list[str]:
        p = self.prefix(tp)
        return [p + "progress", p + "epoch", p + "state", p + "pending"]

    def _today(self) -> int:
        return int(self.clock.now().timestamp() * 1000) // DAY_MS

    def _claims_expire_at(self) -> int:
        """Today's claim bucket lives until the stream's retention plus a margin is over."""
        return (self._today() + 1) * DAY_MS // 1000 + self.claim_ttl_ms // 1000

    def _bucket_keys(self, tp: TP) -> list[str]:
        today = self._today()
        return [f"{self.prefix(tp)}claims:{today - n}" for n in range(self.buckets)]

    # -- Store ---------------------------------------------------------------------------------
    def acquire(self, tp: TP) -> int:
        return int(self.client.incr(self.prefix(tp) + "epoch"))

    def epoch(self, tp: TP) -> int:
        return int(self.client.get(self.prefix(tp) + "epoch") or 0)

    def load(self, tp: TP) -> Progress:
        return Progress.from_fields(self.client.hgetall(self.prefix(tp) + "progress"))

    def claimed(
        self, tp: TP, revision: int, event_ids: Sequence[str], *, dead: bool = False
    ) -> set[str]:
        if not event_ids:
            return set()
        members = [claim_member(e, revision, dead=dead) for e in event_ids]
        pipe = self.client.pipeline(transaction=False)
        for bucket in self._bucket_keys(tp):
            pipe.smismember(bucket, members)
        found: set[str] = set()
        for answers in pipe.execute():
            found.update(e for e, hit in zip(event_ids, answers, strict=True) if hit)
        return found

    def decisions(
        self, tp: TP, revision: int, event_ids: Sequence[str]
    ) -> tuple[set[str], set[str]]:
        if not event_ids:
            return set(), set()
        members = [claim_member(e, revision) for e in event_ids]
        members += [claim_member(e, revision, dead=True) for e in event_ids]
        pipe = self.client.pipeline(transaction=False)
        for bucket in self._bucket_keys(tp):
            pipe.smismember(bucket, members)
        applied: set[str] = set()
        dead: set[str] = set()
        n = len(event_ids)
        for answers in pipe.execute():
            applied.update(e for e, hit in zip(event_ids, answers[:n], strict=True) if hit)
            dead.update(e for e, hit in zip(event_ids, answers[n:], strict=True) if hit)
        return applied, dead

    def decisions_many(
        self, asks: Sequence[tuple[TP, int, Sequence[str]]]
    ) -> list[tuple[set[str], set[str]]]:
        return [self.decisions(tp, revision, ids) for tp, revision, ids in asks]

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

    def commit(self, commit: Commit) -> None:
        tp = commit.tp
        buckets = self._bucket_keys(tp)
        keys = self._core_keys(tp) + buckets
        index: dict[str, int] = {}
        ops_args: list[str | bytes] = []
        for op in commit.redis:
            if op.op not in OPS:
                raise ValueError(f"unknown Redis effect op {op.op!r}")
            logical = [op.key, str(op.args[0])] if op.op == "SLOT" else [op.key]
            args = op.args[1:] if op.op == "SLOT" else op.args
            idx = []
            for name in logical:
                full = self.key(tp, name)
                if full not in index:
                    keys.append(full)
                    index[full] = len(keys)  # Lua is 1-based
                idx.append(str(index[full]))
            ops_args += [op.op, str(len(idx)), *idx, str(len(args)), *(_arg(a) for a in args)]
        fields = commit.progress.as_fields()
        expire_at = self._claims_expire_at()
        argv: list[str | bytes] = [
            str(commit.epoch),
            str(commit.expected_acked),
            str(commit.expected_revision),
            str(expire_at),
            str(len(buckets)),
            "1" if commit.pending is not None else "0",
            str(commit.progress.fold_generation),
            str(len(commit.claims) + len(commit.dead_claims)),
            *(claim_member(e, commit.progress.cursor_revision) for e in commit.claims),
            *(
                claim_member(e, commit.progress.cursor_revision, dead=True)
                for e in commit.dead_claims
            ),
            str(len(fields)),
            *(x for kv in fields.items() for x in kv),
            str(len(commit.states)),
            *(
                x
                for p, s in commit.states.items()
                for x in (p, orjson.dumps(s) if s is not None else "")
            ),
            encode_pending(commit.pending) if commit.pending is not None else "",
            str(len(commit.redis)),
            *ops_args,
        ]
        argv.append(str(len(commit.cleared_failures)))
        for batch_key in commit.cleared_failures:
            keys.append(self._failure_key(tp, batch_key))
            argv.append(str(len(keys)))
        keys.append(self._excluded_key(tp))
        argv += [str(len(keys)), str(len(commit.excluded_add))]
        argv += [str(o) for o in commit.excluded_add]
        argv += [str(len(commit.excluded_remove)), *(str(o) for o in commit.excluded_remove)]
        self._raise_for(tp, commit, self._commit(keys=keys, args=argv))

    def commit_many(self, commits: Sequence[Commit]) -> list[Exception | None]:
        answers: list[Exception | None] = []
        for commit in commits:
            try:
                self.commit(commit)
            except (Fenced, CursorMoved, PendingEffects) as refused:
                answers.append(refused)
            else:
                answers.append(None)
        return answers

    def _raise_for(self, tp: TP, commit: Commit | None, result: list[bytes]) -> None:
        status = result[0].decode()
        if status == "OK":
            return
        if status == "FENCED":
            raise Fenced(tp, commit.epoch if commit else -1, int(result[1] or 0))
        if status == "MOVED":
            expected = (commit.expected_acked, commit.expected_revision) if commit else (-1, -1)
            raise CursorMoved(tp, expected, (int(result[1]), int(result[2])))
        if status == "PENDING":
            raise PendingEffects(tp)
        if status == "CLAIMED" and commit is not None:
            # A claim appeared that this owner did not see when it read: treat as a moved cursor.
            raise CursorMoved(
                tp,
                (commit.expected_acked, commit.expected_revision),
                (commit.expected_acked, commit.expected_revision),
            )
        raise RuntimeError(f"unexpected answer from the commit script: {result!r}")

    def pending(self, tp: TP) -> list[OutRecord]:
        return decode_pending(self.client.get(self.prefix(tp) + "pending") or b"")

    def clear_pending(self, tp: TP, epoch: int) -> None:
        result = self._clear(keys=self._core_keys(tp), args=[str(epoch)])
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
    ) -> None:
        fields = progress.as_fields()
        items = list((states or {}).items())
        argv: list[str | bytes] = [
            "" if epoch is None else str(epoch),
            str(expected[0]),
            str(expected[1]),
            "1" if states is not None else "0",
            "" if expected_generation is None else str(expected_generation),
            str(len(fields)),
            *(x for kv in fields.items() for x in kv),
            str(len(items)),
            *(x for p, s in items for x in (p, orjson.dumps(s))),
            str(len(readmit)),
            *(str(o) for o in readmit),
            str(len(exclude)),
            *(str(o) for o in exclude),
            str(len(dead_claims)),
            *(claim_member(e, progress.cursor_revision, dead=True) for e in dead_claims),
            str(self._claims_expire_at()),
        ]
        keys = [*self._core_keys(tp), self._excluded_key(tp), self._bucket_keys(tp)[0]]
        result = self._replace(keys=keys, args=argv)
        status = result[0].decode()
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
