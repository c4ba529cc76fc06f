"""The cut between the runtime and Kafka (httpx's transport idea): the runner talks only to these
protocols. ``kafka_transport`` implements them on confluent-kafka; ``memory_transport`` on an in-memory log
for the property tests.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from consumers.runtime.types import TP, OutRecord, Record


@dataclass(frozen=True, slots=True)
class Committed:
    """A group's committed offset of one partition (the next offset to read) and the metadata
    string committed with it ("" when the committer wrote none, as Kafka's own tools do)."""

    offset: int
    metadata: str = ""


# Called with newly assigned partitions; returns the offset to start each one at (from the
# cursor stored with the state, or None for "from the beginning").
AssignCallback = Callable[[list[TP]], Mapping[TP, int | None]]
# Called with partitions about to be taken away, before they go.
RevokeCallback = Callable[[list[TP]], None]


class Transport(Protocol):
    """A consumer-group member reading the streams."""

    def subscribe(
        self, topics: list[str], on_assign: AssignCallback, on_revoke: RevokeCallback
    ) -> None: ...

    def poll(self, max_records: int, timeout: float) -> list[Record]:
        """Up to ``max_records`` records, in offset order per partition. Rebalance callbacks run
        inside this call, never between two of the runner's steps."""

    def assignment(self) -> set[TP]: ...

    def pause(self, tps: Iterable[TP]) -> None: ...

    def resume(self, tps: Iterable[TP]) -> None: ...

    def seek(self, tp: TP, offset: int) -> None: ...

    def commit_offsets(self, offsets: Mapping[TP, int], marks: Mapping[TP, str]) -> None:
        """Record progress in the group (next offset to read), asynchronously, with each
        partition's metadata (``marks``: the cursor it was committed from): for lag tooling,
        and to tell a store restored from an older copy; the cursor in the store is what
        resumes work."""

    def committed(self, tps: Iterable[TP]) -> dict[TP, Committed | None]:
        """The group's committed offsets with their metadata (read_committed: a transaction's
        offsets count only once it committed); None where the group has none."""

    def high_watermark(self, tp: TP, *, cached: bool = True) -> int:
        """End offset of the partition; -1 when unknown. ``cached`` may answer from the last
        fetch instead of asking the broker."""

    def caught_up(self, tps: Iterable[TP]) -> bool:
        """These partitions have been read up to their end (as far as this reader may read: for
        read_committed, up to the last stable offset)."""

    def position(self, tp: TP) -> int | None:
        """The offset after everything this member's polls have handed over from the partition:
        past the last record delivered and, once a poll found the partition read to its end,
        that end as this reader sees it — past transaction markers (and aborted records), which
        take offsets but are never delivered. None until a poll handed something over since the
        partition was assigned or last sought. Records the caller was handed are never behind
        it; records it was not handed are never before it."""

    def log_start(self, tp: TP) -> int:
        """The partition's first retained offset (0 until retention deleted something)."""

    def group_metadata(self) -> Any:
        """The member's current group metadata, for ``Output.send_offsets``: metadata taken
        before a rebalance is refused (the transaction then fails, abortable)."""

    def close(self) -> None:
        """Leave the group; the revoke callback runs for everything still assigned."""


class Output(Protocol):
    """A transactional producer for Kafka effects: records and consumed offsets commit together."""

    def begin(self) -> None: ...

    def produce(self, record: OutRecord) -> None: ...

    def send_offsets(
        self,
        offsets: Mapping[TP, int],
        group_metadata: Any,
        metadata: Mapping[TP, str] | None = None,
    ) -> None:
        """Consumed offsets into the open transaction; ``metadata`` is committed with them (a
        marker that names the transaction, read back through ``Transport.committed``)."""

    def commit(self) -> None: ...

    def abort(self) -> None: ...

    def close(self) -> None: ...


class OutputLog(Protocol):
    """Reads back what Kafka effects produced, as ``read_committed`` readers see it: recovery's
    evidence when the group's offsets cannot say whether a transaction landed (their marker was
    overwritten from outside, e.g. an operator's offset reset)."""

    def find(self, records: Sequence[OutRecord], since_ms: int) -> set[str]:
        """The ids among ``records`` that are committed on their topics. Everything written from
        ``since_ms`` (epoch milliseconds) on is looked at; an implementation may look further
        back."""


class Redelivery(Protocol):
    """Reads a subscription's redelivery topic (operator retries of dead letters). Partition k of
    it belongs to origin partition k of the streams' flattened partition space, and is read by
    whoever owns that origin partition, with progress kept in the origin's cursor."""

    topic: str

    def assign(self, partition: int, offset: int | None) -> None: ...

    def unassign(self, partition: int) -> None: ...

    def poll(self, max_records: int) -> list[Record]: ...

    def close(self) -> None: ...
