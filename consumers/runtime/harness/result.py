"""What a run of a processor in the in-memory world left (``run.run`` makes one)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from consumers.runtime.harness.world import partition_of
from consumers.runtime.types import JSON, TP, OutRecord, SqlStatement


@dataclass(frozen=True)
class Applied:
    """One event's application: where and at which cursor revision it ran, and the SQL
    statements and file lines it returned (recorded, not run)."""

    event_id: str
    project_id: str
    partition: TP
    offset: int
    cursor_revision: int
    sql: list[SqlStatement] = field(default_factory=list)
    lines: list[bytes] = field(default_factory=list)


@dataclass(frozen=True)
class CaughtUpCall:
    """An eventless caught-up call that committed: the partition, and the cursor it was made at
    (``delivery.offset`` is ``acked_through``)."""

    partition: TP
    offset: int
    cursor_revision: int


@dataclass(frozen=True)
class DeadLettered:
    """An event (or a record that is no event: ``event_id`` None) in a dead letter."""

    event_id: str | None
    reason: str
    attempts: int
    partition: TP
    offset: int
    value: bytes | None


@dataclass(frozen=True)
class PartitionCursor:
    acked_through: int
    cursor_revision: int
    reduced_through: int


@dataclass(frozen=True)
class Result:
    """What a run left.

    - ``redis``: per stream partition, each key as the processor named it (relative to its
      namespace) and its value: a hash as a dict, a set as a set, a list as a list, a string as
      a string;
    - ``records``: the Kafka records produced (as read_committed readers see them), per output
      topic and partition in log order;
    - ``applied``: every event applied, in the order its claim committed (per partition in
      offset order), with its SQL statements and file lines;
    - ``folds``: each project's fold; ``dead_letters``; ``cursors`` of the partitions the events
      went to;
    - ``caught_up_calls``: the eventless caught-up calls that committed (a processor with
      ``caught_up_call``), in order;
    - ``failpoints``: how often the run passed each fail-point (what ``crash_at`` can name).
    """

    redis: dict[TP, dict[str, Any]]
    records: list[OutRecord]
    applied: list[Applied]
    folds: dict[str, JSON]
    dead_letters: list[DeadLettered]
    cursors: dict[TP, PartitionCursor]
    caught_up_calls: list[CaughtUpCall]
    failpoints: dict[str, int]

    @property
    def sql(self) -> list[SqlStatement]:
        """Every applied event's statements, in applied order."""
        return [statement for a in self.applied for statement in a.sql]

    @property
    def lines(self) -> list[bytes]:
        """Every applied event's file lines, in applied order."""
        return [line for a in self.applied for line in a.lines]

    def partition_of(self, project: str) -> TP:
        return partition_of(project)

    def redis_of(self, project: str) -> dict[str, Any]:
        """The keys on the partition ``project`` lives on (its keys, and any the processor
        shares between the projects of that partition)."""
        return self.redis.get(partition_of(project), {})

    def read(self, tp: TP, key: str) -> Any:
        """One key's value, as ``Store.read`` gives it: a reader written against the store reads
        a result as well."""
        return self.redis.get(tp, {}).get(key)
