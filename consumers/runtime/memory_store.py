"""The ``Store`` in memory, for the property tests: the same commit semantics as
``redis_store.RedisStore`` (all-or-nothing, fenced by the owner epoch, compare-and-set on the
cursor), with effects applied to a small Redis-alike keyspace tests can read. The shared contract
(``tests/contracts/store.py``) holds it to the Redis store."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence

import orjson

from consumers.runtime.store import OPS, Commit, decode_pending, encode_pending
from consumers.runtime.types import JSON, TP, OutRecord, Progress, RedisOp
from streams.errors import ClaimsFound, CursorMoved, Fenced, PendingEffects

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

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._epochs: dict[TP, int] = {}
        self._progress: dict[TP, Progress] = {}
        self._claims: dict[TP, set[tuple[str, int | str]]] = {}
        self._states: dict[TP, dict[str, str]] = {}
        self._pending: dict[TP, bytes] = {}
        self._failures: dict[tuple[TP, str], int] = {}
        self._excluded: dict[TP, set[int]] = {}
        self.space = _Keyspace()
        self.commits = 0

    def key(self, tp: TP, logical: str) -> str:
        return f"{tp.topic}|{tp.partition}|{logical}"

    def acquire(self, tp: TP) -> int:
        with self._lock:
            self._epochs[tp] = self._epochs.get(tp, 0) + 1
            return self._epochs[tp]

    def epoch(self, tp: TP) -> int:
        with self._lock:
            return self._epochs.get(tp, 0)

    def load(self, tp: TP) -> Progress:
        with self._lock:
            return Progress.from_fields(self._progress.get(tp, Progress()).as_fields())

    def claimed(
        self, tp: TP, revision: int, event_ids: Sequence[str], *, dead: bool = False
    ) -> set[str]:
        with self._lock:
            have = self._claims.get(tp, set())
            member = f"{revision}d" if dead else revision
            return {e for e in event_ids if (e, member) in have}

    def decisions(
        self, tp: TP, revision: int, event_ids: Sequence[str]
    ) -> tuple[set[str], set[str]]:
        return self.claimed(tp, revision, event_ids), self.claimed(
            tp, revision, event_ids, dead=True
        )

    def decisions_many(
        self, asks: Sequence[tuple[TP, int, Sequence[str]]]
    ) -> list[tuple[set[str], set[str]]]:
        return [self.decisions(tp, revision, ids) for tp, revision, ids in asks]

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
            if not commit.looked:
                ids = {event_id for event_id, _ in claims}
                if any(e in ids for e in (*commit.claims, *commit.dead_claims, *commit.unclaimed)):
                    raise ClaimsFound(tp)
            wanted: list[tuple[str, int | str]] = [(e, rev) for e in commit.claims]
            wanted += [(e, f"{rev}d") for e in commit.dead_claims]
            for event_id, member in wanted:
                if (event_id, member) in claims:
                    raise CursorMoved(
                        tp,
                        (commit.expected_acked, commit.expected_revision),
                        (commit.expected_acked, rev),
                    )
            for op in commit.redis:
                if op.op not in OPS:
                    raise ValueError(f"unknown Redis effect op {op.op!r}")
            key_of = {k: self.key(tp, k) for op in commit.redis for k in op_keys(op)}
            claims.update((e, rev) for e in commit.claims)
            claims.update((e, f"{rev}d") for e in commit.dead_claims)
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
    ) -> None:
        with self._lock:
            self._check(tp, epoch, expected[0], expected[1], expected_generation)
            rev = progress.cursor_revision
            self._claims.setdefault(tp, set()).update((e, f"{rev}d") for e in dead_claims)
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
