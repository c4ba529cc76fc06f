"""The runtime's vocabulary: records, partitions, the processor contract, deliveries, effects.

A *processor* (a subscription) is a class with a ``slug``, the event types it ``consumes``, an
optional total per-project ``reduce(state, event)`` with a ``reducer_version``, and
``process(event, state, delivery)`` that returns its effects *as data*. The runtime applies the
effects together with the claim and the cursor, atomically — that is what makes them exactly
once — so a processor never writes to Redis or Kafka itself.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar, NamedTuple, Protocol, runtime_checkable

import orjson

from streams.envelopes import Event
from streams.headers import header

JSON = dict[str, Any]

# The metadata of the group offsets the runtime commits: with Kafka effects the sequence number
# of the transaction that committed them; with other effects the cursor the store held then. A
# store whose cursor is behind either was restored from an older copy (Controls.behind).
TXN_MARKER_PREFIX = "rhumbatron.txn="
CURSOR_MARKER_PREFIX = "rhumbatron.cursor="


def parse_txn_marker(metadata: str) -> int | None:
    """The transaction sequence a committed offset's metadata names; None when it names none
    (committed by someone else, e.g. an operator's reset with Kafka's own tools)."""
    return _marked(metadata, TXN_MARKER_PREFIX)


def parse_cursor_marker(metadata: str) -> int | None:
    """The cursor (acknowledged through) a committed offset's metadata names; None when it names
    none (committed by someone else, or by a release before these markers)."""
    return _marked(metadata, CURSOR_MARKER_PREFIX)


def _marked(metadata: str, prefix: str) -> int | None:
    if not metadata.startswith(prefix):
        return None
    digits = metadata[len(prefix) :]
    return int(digits) if digits.lstrip("-").isdigit() else None


@dataclass(frozen=True, slots=True, order=True)
class TP:
    """A topic-partition."""

    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}[{self.partition}]"


Headers = tuple[tuple[str, bytes], ...]


class Record:
    """One record as the transport hands it over: raw bytes, not yet decoded.

    ``headers`` is a tuple, or a function that returns them: a Kafka message builds its header
    list on the first ask (3 µs a record here, a twentieth of a subscription's time per event),
    and most records are never asked (no tracing, not a redelivery, not dead-lettered). It is
    called at most once; the record is read-only after that as before."""

    __slots__ = ("_headers", "key", "offset", "partition", "timestamp_ms", "topic", "value")

    def __init__(
        self,
        topic: str,
        partition: int,
        offset: int,
        key: bytes | None,
        value: bytes | None,
        headers: Headers | Callable[[], Any] = (),  # the function returns a list or None
        timestamp_ms: int = 0,
    ) -> None:
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.key = key
        self.value = value
        self.timestamp_ms = timestamp_ms
        self._headers = headers

    @property
    def headers(self) -> Headers:
        found = self._headers
        if callable(found):
            found = self._headers = tuple(found() or ())
        return found

    @property
    def tp(self) -> TP:
        return TP(self.topic, self.partition)

    def header(self, name: str) -> bytes | None:
        """The first value under ``name`` (or a legacy name of it: streams.headers)."""
        return header(self.headers, name)

    def _fields(self) -> tuple[object, ...]:
        return (
            self.topic,
            self.partition,
            self.offset,
            self.key,
            self.value,
            self.headers,
            self.timestamp_ms,
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Record):
            return NotImplemented
        return self._fields() == other._fields()

    def __hash__(self) -> int:
        return hash(self._fields())

    def __repr__(self) -> str:
        return (
            f"Record(topic={self.topic!r}, partition={self.partition}, offset={self.offset}, "
            f"key={self.key!r}, value={self.value!r}, headers={self.headers!r}, "
            f"timestamp_ms={self.timestamp_ms})"
        )


class Phase(StrEnum):
    CATCHING_UP = "catching-up"
    LIVE = "live"


@dataclass(frozen=True, slots=True)
class Delivery:
    """What ``process`` learns about the delivery of one event (from 002's delivery context)."""

    tp: TP
    offset: int
    phase: Phase
    caught_up: bool
    cursor_revision: int
    redelivered: bool = False  # came back through the operator's dead-letter retry
    # The record's value, when it is the event's canonical encoding, for a processor that
    # ``keeps_wire`` (so one that writes the envelope on need not encode it again); else None.
    wire: bytes | None = field(default=None, repr=False)
    # Raises ``Fenced`` when this process no longer owns the partition: a processor calls it
    # right before a side effect it makes itself, outside the runtime's fenced commit (an
    # outbox write, a shared counter), so a zombie cannot act.
    check_owner: Callable[[], None] = field(default=lambda: None, compare=False, repr=False)

    def idempotency_key(self, key: str) -> str:
        """f(key, source offset, cursor revision): a crash retry gets the same key, a deliberate
        ``reprocess_from`` (which bumps the revision) a new one."""
        raw = f"{key}\x00{self.tp.topic}\x00{self.tp.partition}\x00{self.offset}\x00{self.cursor_revision}"
        return "idk_" + hashlib.sha256(raw.encode()).hexdigest()[:32]


class EffectKind(StrEnum):
    REDIS = "redis"  # views, ledger: claim + effect + cursor in one Lua script
    KAFKA = "kafka"  # commands, metric points: records + offsets in one Kafka transaction
    FILES = "files"  # archive parts: boundaries recorded with the cursor, then written
    SQL = "sql"  # statements run in your PostgreSQL, in one transaction with claims and cursor
    NONE = "none"  # fold only


@dataclass(slots=True)
class RedisOp:
    """One Redis write, as data. ``key`` is relative to the processor's namespace and the
    partition's hash tag (the runtime builds the full key, so every key of a script shares the
    tag). Supported ``op`` values are listed in ``consumers.runtime.redis_store.OPS``.

    Not frozen, though nothing changes one once made: a processor makes several per event, and
    a frozen dataclass's ``__init__`` (one ``object.__setattr__`` call per field) costs about
    three times a plain slotted one's."""

    op: str
    key: str
    args: tuple[str | int | float, ...] = ()


@dataclass(frozen=True, slots=True)
class OutRecord:
    """A record a Kafka-effect processor wants produced, with a stable id so a re-send after a
    crash is recognisably the same record."""

    topic: str
    key: str
    value: bytes
    record_id: str
    headers: tuple[tuple[str, bytes], ...] = ()


@dataclass(frozen=True, slots=True)
class SqlStatement:
    """One statement a SQL-effect processor wants run in its database: the SQL text with
    psycopg placeholders (``%s`` or ``%(name)s``) and their parameters. The runtime runs an
    event's statements in order, under one SAVEPOINT, in the transaction that also moves the
    cursor: all of them or none."""

    sql: str
    params: Sequence[Any] | Mapping[str, Any] = ()


@dataclass(slots=True)
class Effects:
    redis: list[RedisOp] = field(default_factory=list)
    records: list[OutRecord] = field(default_factory=list)
    lines: list[bytes] = field(default_factory=list)  # files processors: this event's part lines
    sql: list[SqlStatement] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.redis or self.records or self.lines or self.sql)


NO_EFFECTS = Effects()


@runtime_checkable
class Processor(Protocol):
    """A subscription. ``reduce`` must be total: if it raises, the event counts as failing and is
    not folded. State is per project (events are ordered per project, and a project lives on one
    partition), stored with the partition's cursor."""

    slug: ClassVar[str]
    consumes: ClassVar[frozenset[str] | None]  # None: every event type
    reducer_version: ClassVar[str]  # "" when the processor keeps no fold
    effect_kind: ClassVar[EffectKind]
    keeps_wire: ClassVar[bool]  # the runtime hands it each canonical record value (Delivery.wire)
    # process(None, folds, delivery) once a partition is read to its end with no event for it
    # in the last scan (consumers.runtime.caught_up)
    caught_up_call: ClassVar[bool]

    def validate(self, event: Event) -> None: ...

    def reduce(self, state: JSON | None, event: Event) -> JSON | None: ...

    def process(self, event: Event, state: JSON | None, delivery: Delivery) -> Effects: ...

    def finish_batch(
        self, records: list[OutRecord], ops: list[RedisOp], check_owner: Callable[[], None]
    ) -> list[OutRecord]: ...


class BaseProcessor:
    """Defaults: no fold, every event type."""

    slug: ClassVar[str] = ""
    consumes: ClassVar[frozenset[str] | None] = None
    reducer_version: ClassVar[str] = ""
    effect_kind: ClassVar[EffectKind] = EffectKind.REDIS
    keeps_wire: ClassVar[bool] = False
    caught_up_call: ClassVar[bool] = False

    def validate(self, event: Event) -> None:
        """Raise (any exception) to refuse ``event`` as bad input: it is dead-lettered at once
        with the exception's text as the reason, neither folded nor processed, and its project
        goes on. An operator's retry of the letter runs ``validate`` again."""

    def reduce(self, state: JSON | None, event: Event) -> JSON | None:
        return state

    def process(self, event: Event, state: JSON | None, delivery: Delivery) -> Effects:
        return NO_EFFECTS

    def finish_batch(
        self, records: list[OutRecord], ops: list[RedisOp], check_owner: Callable[[], None]
    ) -> list[OutRecord]:
        """Once per partition batch, after the last ``process`` and before the commit, with the
        records of the batch's applied events in order: the records to send. A processor may
        decide there, in one round trip for the whole batch, which of them exist (the causal
        router's daily command cap), dropping the others and adding Redis ops to ``ops`` (the
        batch's, committed with it). ``check_owner`` is the batch's ownership check, to call
        before a write of its own. Raising fails the poll, not an event: the batch comes again
        and must be decided the same way."""
        return records


class Park(NamedTuple):
    """Why a project waits in a partition (consumers.runtime.parking): its event at ``offset``
    is ``event_type``@``version``, newer than the code that read it knows. Its events from
    ``offset`` through the furthest offset the cursor counts handled are neither applied nor
    claimed."""

    offset: int
    event_type: str
    version: int


@dataclass
class Progress:
    """The two cursors of one (subscription, partition), stored with the state they describe.

    - reduction: ``reducer_version``, ``reduced_through`` (the fold covers every event up to it,
      plus ``applied_beyond``), and the per-project fold state (kept in its own hash).
    - processing: ``acked_through``, ``cursor_revision``.

    ``acked_through`` is contiguous: every offset up to it is applied, dead-lettered or skipped.
    When a failing event holds back its own project, events of other projects after it are
    applied anyway; their offsets sit in ``applied_beyond`` until ``acked_through`` passes them.
    ``dead`` lists offsets dead-lettered (not folded until retried) and ``skipped`` the ranges an
    operator skipped; both only until ``acked_through`` passes them, after which the dead-letter
    index and the audit log remember them.
    """

    acked_through: int = -1
    cursor_revision: int = 0
    reducer_version: str = ""
    reduced_through: int = -1
    applied_beyond: list[int] = field(default_factory=list)
    dead: list[int] = field(default_factory=list)
    pending_effects: bool = False  # Kafka effects written to Redis, transaction not yet known done
    redelivered_next: int = 0  # next offset to read in this partition's redelivery partition
    skipped: list[list[int]] = field(
        default_factory=list
    )  # [first, last] ranges skip_through passed
    # Kafka effects: the sequence number of this partition's latest transaction, committed as
    # the offsets' metadata (``txn_marker``), so recovery can tell whether *that* transaction
    # landed; and when its pending copy was stored (where to look for its records).
    txn_seq: int = 0
    pending_since_ms: int = 0
    # Bumped whenever a control swaps in a rebuilt fold: an owner holding folds it cached
    # before then is refused (compare-and-set) and reloads instead of writing them back.
    fold_generation: int = 0
    # reprocess_from: the cursor it moved back from (the offsets up to it run again), and the
    # ids of events before its offset whose copies sit inside that range (the publisher's crash
    # window makes such copies): the re-run takes them as the duplicates they are.
    rerun_through: int = -1
    rerun_duplicates: list[str] = field(default_factory=list)
    # Records up to this offset have their claims looked up before they are processed: a first
    # fold claimed events there (dead letters, skips) that the live path's check at commit would
    # find only after trying them (Controls.first_fold).
    look_through: int = -1
    # "acked_through:cursor_revision" of the partition's last caught-up delivery (an event's, or
    # the eventless call's: consumers.runtime.caught_up), so a restart does not make it again.
    caught_up: str = ""
    # Projects parked by an event newer than the code knows, by project id: one entry each,
    # however many of its events wait (consumers.runtime.parking).
    parked: dict[str, Park] = field(default_factory=dict)

    def as_fields(self) -> dict[str, str]:
        return {
            "acked_through": str(self.acked_through),
            "cursor_revision": str(self.cursor_revision),
            "reducer_version": self.reducer_version,
            "reduced_through": str(self.reduced_through),
            "applied_beyond": orjson.dumps(self.applied_beyond).decode(),
            "dead": orjson.dumps(self.dead).decode(),
            "pending_effects": "1" if self.pending_effects else "0",
            "redelivered_next": str(self.redelivered_next),
            "skipped": orjson.dumps(self.skipped).decode(),
            "txn_seq": str(self.txn_seq),
            "pending_since_ms": str(self.pending_since_ms),
            "fold_generation": str(self.fold_generation),
            "rerun_through": str(self.rerun_through),
            "rerun_duplicates": orjson.dumps(self.rerun_duplicates).decode(),
            "look_through": str(self.look_through),
            "caught_up": self.caught_up,
            "parked": orjson.dumps({p: list(park) for p, park in self.parked.items()}).decode(),
        }

    @classmethod
    def from_fields(cls, fields: Mapping[str, str] | Mapping[bytes, bytes]) -> Progress:
        f = {
            (k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
            for k, v in fields.items()
        }
        if not f:
            return cls()
        return cls(
            acked_through=int(f.get("acked_through", -1)),
            cursor_revision=int(f.get("cursor_revision", 0)),
            reducer_version=f.get("reducer_version", ""),
            reduced_through=int(f.get("reduced_through", -1)),
            applied_beyond=list(orjson.loads(f.get("applied_beyond", "[]"))),
            dead=list(orjson.loads(f.get("dead", "[]"))),
            pending_effects=f.get("pending_effects", "0") == "1",
            redelivered_next=int(f.get("redelivered_next", 0)),
            skipped=[list(r) for r in orjson.loads(f.get("skipped", "[]"))],
            txn_seq=int(f.get("txn_seq", 0)),
            pending_since_ms=int(f.get("pending_since_ms", 0)),
            fold_generation=int(f.get("fold_generation", 0)),
            rerun_through=int(f.get("rerun_through", -1)),
            rerun_duplicates=list(orjson.loads(f.get("rerun_duplicates", "[]"))),
            look_through=int(f.get("look_through", -1)),
            caught_up=f.get("caught_up", ""),
            parked={
                p: Park(int(o), str(t), int(v))
                for p, (o, t, v) in orjson.loads(f.get("parked", "{}")).items()
            },
        )

    def has_cursor(self) -> bool:
        """A cursor was set: work was acknowledged, or an operator moved it (``reprocess_from``
        bumps the revision, so a cursor set to before the first offset is still a cursor).
        Without one, a new owner of effects in Redis reads from the log start (runner._start)."""
        return self.acked_through >= 0 or self.cursor_revision > 0

    def txn_marker(self) -> str:
        """The offset-commit metadata of this partition's latest transaction."""
        return f"{TXN_MARKER_PREFIX}{self.txn_seq}"

    def cursor_marker(self) -> str:
        """The offset-commit metadata of a partition of other effects: its cursor."""
        return f"{CURSOR_MARKER_PREFIX}{self.acked_through}"

    def parks(self, project_id: str, offset: int) -> bool:
        """Is the event of ``project_id`` at ``offset`` one its project's park holds back?"""
        park = self.parked.get(project_id)
        return park is not None and offset >= park.offset

    def is_done(self, offset: int) -> bool:
        """Already applied, dead-lettered or skipped: redelivery must not run it again."""
        return offset <= self.acked_through or offset in self.applied_beyond or offset in self.dead
