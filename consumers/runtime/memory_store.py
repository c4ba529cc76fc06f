"""The ``Store`` in memory, for the property tests: the same commit semantics as
``redis_store.RedisStore`` (all-or-nothing, fenced by the owner epoch, compare-and-set on the
cursor), with effects applied to a small Redis-alike keyspace tests can read. The shared contract
(``tests/contracts/store.py``) holds it to the Redis store."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from copy import deepcopy

import orjson

from consumers.runtime.layout import LAYOUT, WRITES_SLOT_CLAIMS
from consumers.runtime.slot_claims import APPLIED, CONFLICT, DEAD, NONE, SlotClaims
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
from streams.errors import ClaimsFound, CursorMoved, Fenced, LayoutNewer, PendingEffects

# -- effect semantics, mirrored by the Lua script of redis_store ---------------------------------


class _Keyspace:
    """An in-memory Redis-alike: strings, hashes, sets, lists; just what the ops need."""

    def __init__(self) -> None:
        self.data: dict[str, object] = {}

    def hash(self, key: str) -> dict[str, str]:
        return self.data.setdefault(key, {})  # type: ignore[return-value]

    def set_(self, key: str) -> set[str]:
        return self.data.setdefault(key, set())  # type: ignore[return-value]

    def list_(self, key: str) -> list[str]:
        return self.data.setdefault(key, [])  # type: ignore[return-value]


def _num(value: str | int | float) -> str:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value)


def apply_op(space: _Keyspace, op: RedisOp, key_of: dict[str, str]) -> None:
    key = key_of[op.key]
    a = op.args
    match op.op:
        case "HSET":
            space.hash(key)[str(a[0])] = str(a[1])
        case "HDEL":
            space.hash(key).pop(str(a[0]), None)
        case "HINCRBY":
            h = space.hash(key)
            h[str(a[0])] = str(int(h.get(str(a[0]), "0")) + int(a[1]))
        case "HMAX":
            h = space.hash(key)
            current = h.get(str(a[0]))
            if current is None or float(a[1]) > float(current):
                h[str(a[0])] = _num(a[1])
        case "SET":
            space.data[key] = str(a[0])
        case "INCRBY":
            space.data[key] = str(int(str(space.data.get(key, "0"))) + int(a[0]))
        case "SADD":
            space.set_(key).add(str(a[0]))
        case "SREM":
            space.set_(key).discard(str(a[0]))
        case "RPUSH":
            space.list_(key).append(str(a[0]))
        case "LPUSHTRIM":
            lst = space.list_(key)
            lst.insert(0, str(a[0]))
            del lst[int(a[1]) :]
        case "DEL":
            space.data.pop(key, None)
        case "SLOT":
            # args: missing-set key (logical), slot, cap. key: hash holding 'high'.
            h = space.hash(key)
            missing = space.set_(key_of[str(a[0])])
            slot, cap = int(a[1]), int(a[2])
            high = int(h.get("high", "0"))
            if slot > high:
                for s in range(high + 1, slot):
                    if len(missing) >= cap:
                        h["missing_overflow"] = "1"
                        break
                    missing.add(str(s))
                h["high"] = str(slot)
            else:
                missing.discard(str(slot))
        case _:
            raise ValueError(f"unknown Redis effect op {op.op!r}")


def op_keys(op: RedisOp) -> list[str]:
    """Every logical key an op touches (SLOT also names its missing-set)."""
    return [op.key, str(op.args[0])] if op.op == "SLOT" else [op.key]


class MemoryStore:
    """The Store contract in memory, thread-safe. Effects land in a keyspace tests can read."""

    def __init__(
        self,
        *,
        claim_gap_horizon: int = 1_000,
        speaks: int = LAYOUT,
        writes_slot_claims: bool = WRITES_SLOT_CLAIMS,
    ) -> None:
        self._lock = threading.RLock()
        self._epochs: dict[TP, int] = {}
        self._progress: dict[TP, Progress] = {}
        self._claims: dict[TP, set[tuple[str, int | str]]] = {}
        # Slot claims (layout 2), by (partition, revision, outbox, project).
        self._slots: dict[tuple[TP, int, str, str], SlotClaims] = {}
        self.layouts: dict[TP, int] = {}  # each partition's layout marker (absent: 1)
        self.layout_target = 1  # the environment's, as `state migrate --finalize` sets it
        self.claim_gap_horizon = claim_gap_horizon
        self.speaks = speaks
        self.writes_slot_claims = writes_slot_claims
        self._states: dict[TP, dict[str, str]] = {}
        self._pending: dict[TP, bytes] = {}
        self._failures: dict[tuple[TP, str], int] = {}
        self._excluded: dict[TP, set[int]] = {}
        self.space = _Keyspace()
        self.commits = 0

    def snapshot(self) -> MemoryStore:
        """A copy of everything as it is now, as Redis's snapshot (RDB) would hold it: a store
        restored from an older copy is this copy, used after the original went on."""
        with self._lock:
            lock, self._lock = self._lock, None  # type: ignore[assignment]
            try:
                copy = deepcopy(self)
            finally:
                self._lock = lock
        copy._lock = threading.RLock()
        return copy

    def key(self, tp: TP, logical: str) -> str:
        return f"{tp.topic}|{tp.partition}|{logical}"

    def _layout_check(self, tp: TP) -> int:
        """The partition's layout after this write, or LayoutNewer (nothing written)."""
        found = self.layouts.get(tp, 1)
        if found > self.speaks:
            raise LayoutNewer(f"partition {tp}", found, self.speaks)
        return max(found, min(self.layout_target, self.speaks))

    def _verdict(self, tp: TP, revision: int, event_id: str, slots: Slots) -> int:
        ref = slots.get(event_id)
        if ref is None:
            return NONE
        record = self._slots.get((tp, revision, ref.outbox, ref.project))
        return record.verdict(ref.slot, ref.fingerprint) if record else NONE

    def _claim_slots(
        self, tp: TP, revision: int, event_ids: Iterable[str], slots: Slots, *, dead: bool
    ) -> None:
        for event_id in event_ids:
            ref = slots.get(event_id)
            if ref is not None:
                record = self._slots.setdefault(
                    (tp, revision, ref.outbox, ref.project), SlotClaims()
                )
                record.claim(ref.slot, ref.fingerprint, dead=dead, horizon=self.claim_gap_horizon)

    def finalize(self, layout: int = LAYOUT) -> None:
        """As ``layout.finalize`` does to Redis: every partition, and the new ones, moved to
        ``layout``."""
        with self._lock:
            self.layout_target = layout
            for tp in self._epochs:
                self.layouts[tp] = max(self.layouts.get(tp, 1), layout)

    def slot_claims(self, tp: TP, revision: int, outbox: str, project: str) -> SlotClaims | None:
        """A project's slot record (for tests and the memory figures)."""
        with self._lock:
            return self._slots.get((tp, revision, outbox, project))

    def acquire(self, tp: TP) -> int:
        with self._lock:
            self._layout_check(tp)
            self._epochs[tp] = self._epochs.get(tp, 0) + 1
            return self._epochs[tp]

    def epoch(self, tp: TP) -> int:
        with self._lock:
            return self._epochs.get(tp, 0)

    def load(self, tp: TP) -> Progress:
        with self._lock:
            return Progress.from_fields(self._progress.get(tp, Progress()).as_fields())

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
        with self._lock:
            have = self._claims.get(tp, set())
            out = Decisions(set(), set(), set())
            for e in event_ids:
                by_id = (APPLIED if (e, revision) in have else NONE) | (
                    DEAD if (e, f"{revision}d") in have else NONE
                )
                by_slot = self._verdict(tp, revision, e, slots)
                # As the Redis script: a claim by id answers first; a slot adds what it knows.
                code = by_id | (by_slot & (APPLIED | DEAD)) if by_id else by_slot
                if code & APPLIED:
                    out.applied.add(e)
                if code & DEAD:
                    out.dead.add(e)
                if code & CONFLICT:
                    out.conflicts.add(e)
            return out

    def decisions_many(
        self, asks: Sequence[tuple[TP, int, Sequence[str]]], slots: Slots = NO_SLOTS
    ) -> list[Decisions]:
        return [self.decisions(tp, revision, ids, slots) for tp, revision, ids in asks]

    def states(self, tp: TP, projects: Iterable[str]) -> dict[str, JSON | None]:
        with self._lock:
            stored = self._states.get(tp, {})
            return {p: (orjson.loads(stored[p]) if p in stored else None) for p in projects}

    def all_states(self, tp: TP) -> dict[str, JSON]:
        with self._lock:
            return {p: orjson.loads(v) for p, v in self._states.get(tp, {}).items()}

    def excluded(self, tp: TP) -> set[int]:
        with self._lock:
            return set(self._excluded.get(tp, set()))

    def _check(
        self,
        tp: TP,
        epoch: int | None,
        expected_acked: int | None,
        expected_revision: int,
        expected_generation: int | None,
    ) -> None:
        if epoch is not None and self._epochs.get(tp, 0) != epoch:
            raise Fenced(tp, epoch, self._epochs.get(tp, 0))
        current = self._progress.get(tp, Progress())
        found = (current.acked_through, current.cursor_revision)
        if (
            (expected_acked is not None and found[0] != expected_acked)
            or found[1] != expected_revision
            or (expected_generation is not None and current.fold_generation != expected_generation)
        ):
            raise CursorMoved(
                tp,
                (expected_acked if expected_acked is not None else found[0], expected_revision),
                found,
            )

    def commit_many(self, commits: Sequence[Commit]) -> list[Exception | None]:
        answers: list[Exception | None] = []
        for commit in commits:
            try:
                self.commit(commit)
            except (Fenced, CursorMoved, PendingEffects, ClaimsFound) as refused:
                answers.append(refused)
            else:
                answers.append(None)
        return answers

    def commit(self, commit: Commit) -> None:
        with self._lock:
            tp = commit.tp
            self._check(
                tp,
                commit.epoch,
                commit.expected_acked,
                commit.expected_revision,
                commit.progress.fold_generation,
            )
            if commit.pending is not None and tp in self._pending:
                raise PendingEffects(tp)
            claims = self._claims.setdefault(tp, set())
            rev = commit.progress.cursor_revision
            slots = commit.slots
            everyone = (*commit.claims, *commit.dead_claims, *commit.unclaimed)
            if not commit.looked:
                ids = {event_id for event_id, _ in claims}
                if any(e in ids or self._verdict(tp, rev, e, slots) for e in everyone):
                    raise ClaimsFound(tp)
            wanted: list[tuple[str, int | str]] = [(e, rev) for e in commit.claims]
            wanted += [(e, f"{rev}d") for e in commit.dead_claims]
            moved = CursorMoved(
                tp,
                (commit.expected_acked, commit.expected_revision),
                (commit.expected_acked, rev),
            )
            for event_id, member in wanted:
                if (event_id, member) in claims:
                    raise moved
                verdict = self._verdict(tp, rev, event_id, slots)
                if verdict == CONFLICT or verdict == (DEAD if isinstance(member, str) else APPLIED):
                    raise moved
            for op in commit.redis:
                if op.op not in OPS:
                    raise ValueError(f"unknown Redis effect op {op.op!r}")
            layout = self._layout_check(tp)
            key_of = {k: self.key(tp, k) for op in commit.redis for k in op_keys(op)}
            # Layout 2 keeps an outbox event's claim by slot alone.
            by_id = [e for e in commit.claims if layout < 2 or e not in slots]
            dead_by_id = [e for e in commit.dead_claims if layout < 2 or e not in slots]
            claims.update((e, rev) for e in by_id)
            claims.update((e, f"{rev}d") for e in dead_by_id)
            if self.writes_slot_claims:
                self._claim_slots(tp, rev, commit.claims, slots, dead=False)
                self._claim_slots(tp, rev, commit.dead_claims, slots, dead=True)
                self._claim_slots(tp, rev, commit.passed, slots, dead=False)
            self.layouts[tp] = layout
            for op in commit.redis:
                apply_op(self.space, op, key_of)
            states = self._states.setdefault(tp, {})
            for project, state in commit.states.items():
                if state is None:
                    states.pop(project, None)
                else:
                    encoded = orjson.dumps(state)
                    states[project] = encoded.decode()
                    commit.state_bytes[project] = len(encoded)
            if commit.pending is not None:
                self._pending[tp] = encode_pending(commit.pending)
            for batch_key in commit.cleared_failures:
                self._failures.pop((tp, batch_key), None)
            excluded = self._excluded.setdefault(tp, set())
            excluded.update(commit.excluded_add)
            excluded.difference_update(commit.excluded_remove)
            self._progress[tp] = Progress.from_fields(commit.progress.as_fields())
            self.commits += 1

    def pending(self, tp: TP) -> list[OutRecord]:
        with self._lock:
            return decode_pending(self._pending.get(tp, b""))

    def clear_pending(self, tp: TP, epoch: int) -> None:
        with self._lock:
            self._layout_check(tp)
            if self._epochs.get(tp, 0) != epoch:
                raise Fenced(tp, epoch, self._epochs.get(tp, 0))
            self._pending.pop(tp, None)
            self._progress.setdefault(tp, Progress()).pending_effects = False

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
        with self._lock:
            layout = self._layout_check(tp)
            self._check(tp, epoch, expected[0], expected[1], expected_generation)
            rev = progress.cursor_revision
            self._claims.setdefault(tp, set()).update(
                (e, f"{rev}d") for e in dead_claims if layout < 2 or e not in slots
            )
            if self.writes_slot_claims:
                self._claim_slots(tp, rev, dead_claims, slots, dead=True)
            self.layouts[tp] = layout
            excluded = self._excluded.setdefault(tp, set())
            excluded.difference_update(readmit)
            excluded.update(exclude)
            if states is not None:
                self._states[tp] = {p: orjson.dumps(s).decode() for p, s in states.items()}
            self._progress[tp] = Progress.from_fields(progress.as_fields())

    def count_failure(self, tp: TP, batch_key: str) -> int:
        with self._lock:
            self._failures[(tp, batch_key)] = self._failures.get((tp, batch_key), 0) + 1
            return self._failures[(tp, batch_key)]

    def clear_failures(self, tp: TP, batch_key: str) -> None:
        with self._lock:
            self._failures.pop((tp, batch_key), None)

    def read(self, tp: TP, key: str) -> object:
        with self._lock:
            value = self.space.data.get(self.key(tp, key))
            if isinstance(value, dict):
                return dict(value)
            if isinstance(value, set):
                return set(value)
            if isinstance(value, list):
                return list(value)
            return value
