"""Where a subscription keeps its progress, claims, fold and effects: the ``Store`` protocol and
what every backend shares (the commit, the effect ops, the pending copy's encoding). Beside it:
``redis_store.RedisStore``, the real one, and ``memory_store.MemoryStore``, the twin the property
tests run on, and ``sql_store.SqlStore``, for SQL-effect processors, in their own PostgreSQL; one
shared test class (``tests/contracts/store.py``) runs against all three.

The heart is :meth:`Store.commit`: claims, Redis effects (or SQL statements), fold state, pending
Kafka effects and the new cursor, applied all-or-nothing, and only if the caller still owns the
partition (its owner epoch is current) and the cursor is where the caller read it
(compare-and-set).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

import orjson

from consumers.runtime.slot_claims import SlotRef
from consumers.runtime.types import JSON, TP, OutRecord, Progress, RedisOp, SqlStatement

# Where the outbox events among a call's event ids sit (by event id): their claims are kept by
# slot (consumers.runtime.slot_claims); every other event's by id.
Slots = Mapping[str, SlotRef]
NO_SLOTS: Slots = {}


class Decisions(NamedTuple):
    """What the claims say of some events at one cursor revision."""

    applied: set[str]
    dead: set[str]  # dead-lettered (or skipped by an operator)
    # Outbox events whose slot another event already holds: dead-lettered as a conflict.
    conflicts: set[str]


@dataclass(frozen=True, slots=True)
class EventStatements:
    """One applied event's SQL effects, run in order and all-or-nothing (``sql_store``): a
    failure of one fails that event, and holds back the later events of its project."""

    event_id: str
    project_id: str
    statements: Sequence[SqlStatement]


@dataclass
class Commit:
    """Everything one batch of one partition writes, atomically."""

    tp: TP
    epoch: int
    expected_acked: int
    expected_revision: int
    progress: Progress  # its fold_generation is the one the caller read (compare-and-set too)
    claims: list[str] = field(
        default_factory=list
    )  # event ids, claimed at progress.cursor_revision
    slots: Slots = field(default_factory=dict)  # of the outbox events among these lists
    # Outbox events the processor does not consume: claimed by slot alone (never by id), so a
    # project's record stays its base when a subscription reads only some of its events. A
    # slot is a position in the project's log, which a subscription passes whether or not it
    # acts on what is there.
    passed: list[str] = field(default_factory=list)
    # Event ids dead-lettered by this commit: a later copy of one is a duplicate of the dead
    # letter (one letter per event); only an operator's retry applies it.
    dead_claims: list[str] = field(default_factory=list)
    redis: list[RedisOp] = field(default_factory=list)
    sql: list[EventStatements] = field(default_factory=list)  # in offset order (SqlStore only)
    states: dict[str, JSON | None] = field(default_factory=dict)  # None deletes
    # Set by the store as it writes them: each state's encoded size (the runner bounds the folds
    # it keeps in memory by these).
    state_bytes: dict[str, int] = field(default_factory=dict)
    pending: list[OutRecord] | None = None  # Kafka effects awaiting their transaction
    cleared_failures: list[str] = field(default_factory=list)  # batch keys now passed
    # Offsets a fold must leave out (dead-lettered), and ones it may take again (a dead letter
    # retried and applied): kept per partition so every refold reads all of them.
    excluded_add: list[int] = field(default_factory=list)
    excluded_remove: list[int] = field(default_factory=list)
    # Whether the caller looked this commit's claims up before processing (Store.decisions).
    # False is the live path's fast way, one round trip a poll instead of two: the commit is
    # then refused with ClaimsFound, writing nothing, if any of its events has a claim stored at
    # all (any revision, applied or dead-lettered), and the caller looks up and processes again.
    looked: bool = True
    # With looked false: event ids judged fresh but not applied (failed, or held back behind a
    # failure of their project), whose claims are checked as the claims' are, and not written.
    unclaimed: list[str] = field(default_factory=list)


class Store(Protocol):
    def acquire(self, tp: TP) -> int:
        """Take ownership of a partition: bump and return its owner epoch."""

    def epoch(self, tp: TP) -> int: ...

    def load(self, tp: TP) -> Progress: ...

    def claimed(
        self,
        tp: TP,
        revision: int,
        event_ids: Sequence[str],
        *,
        dead: bool = False,
        slots: Slots = NO_SLOTS,
    ) -> set[str]:
        """Which of these events are already claimed at this cursor revision (``dead``: which
        were dead-lettered at it)."""

    def decisions(
        self, tp: TP, revision: int, event_ids: Sequence[str], slots: Slots = NO_SLOTS
    ) -> Decisions:
        """(applied, dead-lettered, conflicts) among these events at this revision, in one
        lookup: the live path asks it for every batch."""

    def decisions_many(
        self, asks: Sequence[tuple[TP, int, Sequence[str]]], slots: Slots = NO_SLOTS
    ) -> list[Decisions]:
        """:meth:`decisions` for several (partition, revision, event ids) at once, answers in
        the order asked: one round trip for every partition of a poll."""

    def states(self, tp: TP, projects: Iterable[str]) -> dict[str, JSON | None]: ...

    def all_states(self, tp: TP) -> dict[str, JSON]: ...

    def excluded(self, tp: TP) -> set[int]:
        """Every offset of the partition a fold must leave out (dead-lettered, not applied
        since)."""

    def commit(self, commit: Commit) -> None:
        """Apply atomically; raise Fenced or CursorMoved and write nothing if not allowed."""

    def commit_many(self, commits: Sequence[Commit]) -> list[Exception | None]:
        """:meth:`commit` for several partitions at once (at most one commit per partition),
        each atomic on its own: per commit, in order, None if it applied or the Fenced,
        CursorMoved, PendingEffects, ClaimsFound or StatementsFailed that refused it (having
        written nothing of it). One round trip for every partition of a poll; an error reaching
        the store raises (the SQL store's outage, Unreachable or ServerRefused, having
        committed nothing of the call: its commits share one transaction)."""

    def pending(self, tp: TP) -> list[OutRecord]: ...

    def clear_pending(self, tp: TP, epoch: int) -> None: ...

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
        """Swap in a rebuilt fold (re-reduce) and/or a moved cursor (operator controls),
        compare-and-set on ``expected`` = (acked_through, cursor_revision) and, when given, on
        the fold generation; ``epoch`` None means an operator acting from outside (no ownership
        needed); ``states`` None keeps the fold; ``exclude`` adds offsets the rebuilt fold left
        out (its reduce refused them) and ``readmit`` takes offsets out of the excluded set
        (a reprocess judges them again); ``dead_claims`` are events handled without effect at
        ``progress.cursor_revision`` (skipped), whose later copies are duplicates."""

    def count_failure(self, tp: TP, batch_key: str) -> int:
        """Count one more failure of this batch; returns the count so far."""

    def clear_failures(self, tp: TP, batch_key: str) -> None: ...

    def read(self, tp: TP, key: str) -> object:
        """Read an effect key (for views and tests); shape depends on the key's type."""


# The Redis effect ops a processor may return; memory_store applies them and the Lua script of
# redis_store mirrors it.
OPS = frozenset(
    {
        "HSET",
        "HDEL",
        "HINCRBY",
        "HMAX",
        "SET",
        "INCRBY",
        "SADD",
        "SREM",
        "RPUSH",
        "LPUSHTRIM",
        "DEL",
        "SLOT",
    }
)


def encode_pending(records: Sequence[OutRecord]) -> bytes:
    return orjson.dumps(
        [
            {
                "topic": r.topic,
                "key": r.key,
                "value": r.value.decode("latin-1"),
                "id": r.record_id,
                "headers": [[k, v.decode("latin-1")] for k, v in r.headers],
            }
            for r in records
        ]
    )


def decode_pending(blob: bytes) -> list[OutRecord]:
    if not blob:
        return []
    return [
        OutRecord(
            topic=r["topic"],
            key=r["key"],
            value=r["value"].encode("latin-1"),
            record_id=r["id"],
            headers=tuple((k, v.encode("latin-1")) for k, v in r["headers"]),
        )
        for r in orjson.loads(blob)
    ]
