"""Helpers for the outbox and publisher tests.

- :class:`SimulatedKafka`: an in-memory :class:`EventSender` for unit tests. It keeps a log per
  partition, decides each record's fate with a script, and behaves like librdkafka with
  ``enable.gapless.guarantee``: a record failing in flight fails every later outstanding record of
  its partition; ``abandon`` fails everything outstanding.
- :class:`FaultInjectingSender`: wraps the real :class:`KafkaSender` and makes chosen records fail
  at the producer boundary (the records it lets through go to the real broker). With ``gapless``
  a record it fails "in flight" also fails the later records of its partition still in the
  window, as the gapless producer does; a record it fails "on hand-over" fails alone, as a local
  produce error does.
"""

from __future__ import annotations

import random
import secrets
import sqlite3
import tempfile
from collections import defaultdict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from confluent_kafka import KafkaError

from router.settings import Settings
from streams.clock import ManualClock
from streams.envelopes import Draft
from streams.outbox.sender import EventSender
from streams.outbox.sqlite import SqliteOutbox
from streams.outbox.sqlite_schema import SqliteOptions
from streams.outbox.states import Ordering, PublisherPolicy
from streams.outbox.store import OutboxStore
from streams.producer import DeliveryCallback, DeliveryReport, Headers
from tests.support.kafka import murmur2_partition

if TYPE_CHECKING:
    from tests.support.postgres import FreshSchema

ROW_ERROR = KafkaError.MSG_SIZE_TOO_LARGE
OUTAGE_ERROR = KafkaError._MSG_TIMED_OUT


def policy(**overrides: object) -> PublisherPolicy:
    values: dict[str, object] = {
        "rows_per_project": 100,
        "rows_per_pass": 20_000,
        "max_row_attempts": 10,
        "backoff_initial_s": 1.0,
        "backoff_max_s": 300.0,
        "poll_interval_s": 0.5,
        "delivery_timeout_s": 30.0,
        "ordering": Ordering.SERIAL,
    }
    values.update(overrides)
    return PublisherPolicy(**values)  # type: ignore[arg-type]


def sqlite_outbox(
    path: Path | None = None, *, clock: ManualClock | None = None, missed_limit: int = 1000
) -> SqliteOutbox:
    if path is None:
        path = Path(tempfile.mkdtemp(prefix="outbox-test-")) / "outbox.db"
    return SqliteOutbox(
        path,
        options=SqliteOptions(
            max_envelope_bytes=256 * 1024,
            missed_report_limit=missed_limit,
            busy_timeout_s=30.0,
            synchronous="NORMAL",
        ),
        clock=clock,
    )


def outbox_for(settings: Settings, path: Path) -> SqliteOutbox:
    from router.wiring.outbox import open_outbox

    return open_outbox(settings, path, create=True)


def drafts(project_id: str, count: int, *, tag: str = "") -> list[Draft]:
    """``count`` events of one project with unique ids (task.completed: its payload names the
    agent, as the catalog requires)."""
    tag = tag or secrets.token_hex(3)
    return [
        Draft(
            event_id="evt_" + secrets.token_hex(16),
            event_type="task.completed",
            project_id=project_id,
            change_id=f"chg-{tag}",
            task_id=f"t{n}",
            actor="service:test",
            payload={"agentId": "agent-test", "n": n},
        )
        for n in range(count)
    ]


def append_all(store: OutboxStore, items: Iterable[Draft], tenant_id: str = "tenant-t") -> None:
    by_project: dict[str, list[Draft]] = defaultdict(list)
    for draft in items:
        by_project[draft.project_id].append(draft)
    for project_id, batch in by_project.items():
        with store.transaction() as unit:
            unit.append(project_id, batch, tenant_id=tenant_id)


# Script verdicts for SimulatedKafka: what happens to one record.
OK = "ok"
ROW = "row"  # fails in flight with a row-level error (and, gapless, the rest of the partition)
OUTAGE = "outage"  # fails in flight with an outage error (and the rest of the partition)
HANG = "hang"  # never answered until abandoned
REFUSE = "refuse"  # refused on hand-over (produce fails at once, nothing else affected)
FATAL = "fatal"  # the producer goes fatal: this and everything outstanding fail


@dataclass
class _Record:
    topic: str
    partition: int
    key: str
    value: bytes
    headers: Headers
    on_delivery: DeliveryCallback
    verdict: str


@dataclass
class SimulatedKafka:
    """An in-memory broker + gapless producer. ``script(key, value, nth)`` returns a verdict."""

    script: Callable[[str, bytes, int], str] = lambda key, value, nth: OK
    partitions: int = 2
    clock: ManualClock | None = None
    topics: set[str] | None = None  # None: every topic exists
    log: dict[tuple[str, int], list[tuple[str, bytes]]] = field(
        default_factory=lambda: defaultdict(list)
    )
    produced: int = 0
    _queue: deque[_Record] = field(default_factory=deque)
    _broken: bool = False
    closed: bool = False

    @property
    def broken(self) -> bool:
        return self._broken

    def produce(
        self, topic: str, value: bytes, *, key: str, headers: Headers, on_delivery: DeliveryCallback
    ) -> None:
        if self._broken:
            on_delivery(DeliveryReport(topic, -1, -1, key, KafkaError(KafkaError._FATAL)))
            return
        self.produced += 1
        verdict = self.script(key, value, self.produced)
        partition = murmur2_partition(key, self.partitions)
        if verdict == REFUSE:
            on_delivery(
                DeliveryReport(topic, -1, -1, key, KafkaError(ROW_ERROR, "refused locally"))
            )
            return
        self._queue.append(_Record(topic, partition, key, value, headers, on_delivery, verdict))

    def poll(self, timeout: float) -> None:
        failed_partitions: set[tuple[str, int]] = set()
        hung: deque[_Record] = deque()
        while self._queue:
            record = self._queue.popleft()
            where = (record.topic, record.partition)
            if record.verdict == FATAL:
                self._broken = True
            if self._broken:
                error = KafkaError(KafkaError._PURGE_QUEUE)
                record.on_delivery(DeliveryReport(record.topic, -1, -1, record.key, error))
                continue
            if where in failed_partitions:
                error = KafkaError(KafkaError._PURGE_QUEUE, "gapless: an earlier record failed")
                record.on_delivery(DeliveryReport(record.topic, -1, -1, record.key, error))
                continue
            if record.verdict == HANG or (
                hung and any((r.topic, r.partition) == where for r in hung)
            ):
                hung.append(record)  # stuck behind an unanswered record of its partition
                continue
            if record.verdict in (ROW, OUTAGE):
                failed_partitions.add(where)
                code = ROW_ERROR if record.verdict == ROW else OUTAGE_ERROR
                record.on_delivery(
                    DeliveryReport(record.topic, -1, -1, record.key, KafkaError(code))
                )
                continue
            self.log[where].append((record.key, record.value))
            offset = len(self.log[where]) - 1
            record.on_delivery(
                DeliveryReport(record.topic, record.partition, offset, record.key, None)
            )
        self._queue = hung
        if self.clock is not None and timeout > 0:
            self.clock.advance(timeout)  # waiting for reports takes time

    def outstanding(self) -> int:
        return len(self._queue)

    def abandon(self) -> None:
        for record in self._queue:
            record.verdict = "abandoned"
        queue, self._queue = self._queue, deque()
        for record in queue:
            error = KafkaError(KafkaError._PURGE_QUEUE, "abandoned")
            record.on_delivery(DeliveryReport(record.topic, -1, -1, record.key, error))

    def missing_streams(self, topics: Iterable[str]) -> set[str]:
        return set() if self.topics is None else set(topics) - self.topics

    def close(self) -> None:
        self.closed = True

    def keys_in_order(self) -> dict[str, list[bytes]]:
        out: dict[str, list[bytes]] = defaultdict(list)
        for records in self.log.values():
            for key, value in records:
                out[key].append(value)
        return out


class FaultInjectingSender:
    """The real sender, with failures injected at the producer boundary (see module doc)."""

    def __init__(
        self,
        inner: EventSender,
        *,
        partitions: int,
        seed: int,
        gapless: bool,
        row_rate: float = 0.0,
        outage_rate: float = 0.0,
        refuse_rate: float = 0.0,
    ) -> None:
        self._inner = inner
        self._partitions = partitions
        self._gapless = gapless
        self._rng = random.Random(seed)
        self._rates = (row_rate, outage_rate, refuse_rate)
        self._injected: deque[tuple[DeliveryCallback, DeliveryReport]] = deque()
        self._failing: set[tuple[str, int]] = set()  # partitions failed in the current window
        self.injected = {"row": 0, "outage": 0, "refused": 0, "collateral": 0}

    @property
    def broken(self) -> bool:
        return self._inner.broken

    def produce(
        self, topic: str, value: bytes, *, key: str, headers: Headers, on_delivery: DeliveryCallback
    ) -> None:
        where = (topic, murmur2_partition(key, self._partitions))
        if where in self._failing:
            self.injected["collateral"] += 1
            error = KafkaError(KafkaError._PURGE_QUEUE, "injected: an earlier record failed")
            self._injected.append((on_delivery, DeliveryReport(topic, -1, -1, key, error)))
            return
        row_rate, outage_rate, refuse_rate = self._rates
        draw = self._rng.random()
        if draw < refuse_rate:
            self.injected["refused"] += 1
            on_delivery(
                DeliveryReport(topic, -1, -1, key, KafkaError(ROW_ERROR, "injected refusal"))
            )
            return
        draw -= refuse_rate
        if draw < row_rate + outage_rate:
            kind = "row" if draw < row_rate else "outage"
            self.injected[kind] += 1
            code = ROW_ERROR if kind == "row" else OUTAGE_ERROR
            if self._gapless:
                self._failing.add(where)
            error = KafkaError(code, f"injected {kind} fault")
            self._injected.append((on_delivery, DeliveryReport(topic, -1, -1, key, error)))
            return
        self._inner.produce(topic, value, key=key, headers=headers, on_delivery=on_delivery)

    def poll(self, timeout: float) -> None:
        while self._injected:
            callback, delivery = self._injected.popleft()
            callback(delivery)
        self._inner.poll(timeout if not self._injected else 0)
        if not self.outstanding():
            self._failing.clear()  # the window drained: the next one starts clean

    def outstanding(self) -> int:
        return self._inner.outstanding() + len(self._injected)

    def abandon(self) -> None:
        self._inner.abandon()

    def missing_streams(self, topics: Iterable[str]) -> set[str]:
        return self._inner.missing_streams(topics)

    def close(self) -> None:
        self._inner.close()


def cli_env(settings: Settings, **extra: str) -> dict[str, str]:
    """The environment for a ``python -m router.cli`` subprocess acting on ``settings``."""
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("RHUMBATRON_")}
    for name in (
        "env",
        "kafka_bootstrap",
        "redis_url",
        "partitions",
        "connect_timeout_s",
        "outbox_ordering",
        "outbox_backoff_initial_s",
        "outbox_backoff_max_s",
        "outbox_delivery_timeout_s",
        "outbox_rows_per_project_per_pass",
        "outbox_poll_interval_s",
    ):
        env[f"RHUMBATRON_{name.upper()}"] = str(getattr(settings, name))
    env.update(extra)
    return env


class SlowSender:
    """Delays each hand-over a little, so a test can act while a publish is under way. The
    records still go to the real broker."""

    def __init__(self, inner: EventSender, delay_s: float) -> None:
        self._inner = inner
        self._delay = delay_s

    @property
    def broken(self) -> bool:
        return self._inner.broken

    def produce(
        self, topic: str, value: bytes, *, key: str, headers: Headers, on_delivery: DeliveryCallback
    ) -> None:
        import time

        time.sleep(self._delay)
        self._inner.produce(topic, value, key=key, headers=headers, on_delivery=on_delivery)

    def poll(self, timeout: float) -> None:
        self._inner.poll(timeout)

    def outstanding(self) -> int:
        return self._inner.outstanding()

    def abandon(self) -> None:
        self._inner.abandon()

    def missing_streams(self, topics: Iterable[str]) -> set[str]:
        return self._inner.missing_streams(topics)

    def close(self) -> None:
        self._inner.close()


def records_in(bootstrap: str, topics: Iterable[str]) -> int:
    """How many records the topics hold (sum of high watermarks; nothing is deleted in tests)."""
    import uuid

    import confluent_kafka

    consumer = confluent_kafka.Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"test-count-{uuid.uuid4().hex}"}
    )
    try:
        metadata = consumer.list_topics(timeout=30)
        total = 0
        for topic in topics:
            for partition in metadata.topics[topic].partitions:
                tp = confluent_kafka.TopicPartition(topic, partition)
                low, high = consumer.get_watermark_offsets(tp, timeout=30)
                total += high - low
        return int(total)
    finally:
        consumer.close()


def first_arrivals(slots: Iterable[int]) -> tuple[list[int], int]:
    """A project's slots as read from its stream: the slots in the order each first arrived, and
    how many were copies of one already read. After an outage the publisher re-sends what it gave
    up on, so copies may follow their originals; a later slot never comes first."""
    first: list[int] = []
    seen: set[int] = set()
    copies = 0
    for slot in slots:
        if slot in seen:
            copies += 1
        else:
            seen.add(slot)
            first.append(slot)
    return first, copies


# -- one contract over both backends ----------------------------------------------------------------
class OutboxBackend:
    """One outbox of a backend under test (a fresh SQLite file or a fresh PostgreSQL schema):
    stores over it, and reads of what it holds that do not go through the store."""

    def __init__(self, name: str, folder: Path) -> None:
        self.name = name
        self._stores: list[OutboxStore] = []
        self.path = folder / "outbox.db"
        self.schema: FreshSchema | None = None
        if name == "postgres":
            from tests.support.postgres import FreshSchema

            self.schema = FreshSchema()

    @property
    def address(self) -> str:
        return self.schema.url if self.schema is not None else str(self.path)

    def store(self, *, clock: ManualClock | None = None, missed_limit: int = 1000) -> Any:
        """A new store over this outbox (SqliteOutbox or PostgresOutbox), closed at the end."""
        made: Any
        if self.schema is None:
            made = sqlite_outbox(self.path, clock=clock, missed_limit=missed_limit)
        else:
            from streams.outbox.postgres import PostgresOptions, PostgresOutbox

            made = PostgresOutbox(
                self.schema.url,
                options=PostgresOptions(
                    max_envelope_bytes=256 * 1024, missed_report_limit=missed_limit
                ),
                clock=clock,
            )
        self._stores.append(made)
        return made

    def sql(self, text: str) -> str:
        """The writer's own SQL with this backend's placeholders (written with ``?``)."""
        return text.replace("?", "%s") if self.schema is not None else text

    def query(self, text: str) -> list[tuple[Any, ...]]:
        """Read the outbox's database directly (``?`` placeholders, no parameters)."""
        if self.schema is None:
            conn = sqlite3.connect(self.path)
            try:
                return conn.execute(text).fetchall()
            finally:
                conn.close()
        with self.schema.connect() as pg:
            return list(pg.execute(text.encode()).fetchall())

    def slots(self) -> dict[str, list[int]]:
        """Every project's stored slots in order; asserts event ids are unique."""
        out: dict[str, list[int]] = {}
        for project, slot in self.query(
            "SELECT project_id, slot FROM outbox ORDER BY project_id, slot"
        ):
            out.setdefault(project, []).append(int(slot))
        (total, distinct), *_ = self.query("SELECT COUNT(*), COUNT(DISTINCT event_id) FROM outbox")
        assert total == distinct
        return out

    def reset(self) -> None:
        """Empty the outbox (rows, counters, audit), as if new."""
        if self.schema is None:
            if not self.path.exists():
                return
            conn = sqlite3.connect(self.path)
            with conn:
                for table in ("outbox", "outbox_slots", "outbox_audit"):
                    conn.execute(f"DELETE FROM {table}")
            conn.close()
            return
        with self.schema.connect() as pg:
            pg.execute("TRUNCATE outbox, outbox_slots, outbox_audit")

    def counters(self) -> dict[str, int]:
        return {p: int(n) for p, n in self.query("SELECT project_id, last_slot FROM outbox_slots")}

    def close(self) -> None:
        for store in self._stores:
            store.close()
        if self.schema is not None:
            self.schema.drop()


def open_test_store(address: str, *, missed_limit: int = 1000) -> Any:
    """A store over an outbox named by its address (a SQLite path or a PostgreSQL URL), as a
    writer in another process opens it."""
    if address.startswith("postgresql://"):
        from streams.outbox.postgres import PostgresOptions, PostgresOutbox

        return PostgresOutbox(
            address,
            options=PostgresOptions(
                max_envelope_bytes=256 * 1024, missed_report_limit=missed_limit
            ),
        )
    return sqlite_outbox(Path(address), missed_limit=missed_limit)


def placeholders(address: str, text: str) -> str:
    """SQL written with ``?`` placeholders, for the backend at ``address``."""
    return text.replace("?", "%s") if address.startswith("postgresql://") else text


def write_drafts(
    store: OutboxStore, items: Iterable[Draft], *, writers: int = 4, per_write: int = 5
) -> int:
    """Append ``items`` through the store with ``writers`` concurrent threads (each project
    belongs to one writer, so its events keep their order), ``per_write`` events a transaction,
    with the writers' stale views (seen_slot) as a real writer has them. Returns events written.
    The backend-neutral twin of ``streams.workload.write_workload`` (no writer's table)."""
    from concurrent.futures import ThreadPoolExecutor

    shares: dict[int, list[Draft]] = defaultdict(list)
    owner: dict[str, int] = {}
    for draft in items:
        shares[owner.setdefault(draft.project_id, len(owner) % writers)].append(draft)

    def write(writer: int) -> int:
        seen: dict[str, int] = {}
        written = 0
        batch: list[Draft] = []
        pending = list(shares[writer])
        while pending:
            project = pending[0].project_id
            batch = [d for d in pending if d.project_id == project][:per_write]
            taken = {d.event_id for d in batch}
            pending = [d for d in pending if d.event_id not in taken]
            with store.transaction() as unit:
                result = unit.append(
                    project, batch, tenant_id="tenant-t", seen_slot=seen.get(project)
                )
            seen[project] = result.head
            written += len(result.events)
        return written

    with ThreadPoolExecutor(max_workers=writers) as pool:
        return sum(pool.map(write, range(writers)))
