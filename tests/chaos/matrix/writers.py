"""The row's writers: the workload written through the outbox as a service writes it, and as a
service does when its database goes away under it.

Each write is one transaction, the writer's own state change (a row of its table) and a few
events of one project; each project belongs to one writer, so its events keep their order. A
transaction that fails because the database is unreachable (the connection lost, the server
restarting) is written again, the same events with the same ids: a commit that in fact landed
before the connection died comes back as duplicates (the outbox ignores a repeated event id and
uses no slot for it), one that did not lands now. Either way each project's slots stay dense and
in write order. Any other error is the row's failure, not retried.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import psycopg

from streams.envelopes import Draft
from streams.errors import Unreachable
from streams.outbox.store import OutboxStore
from streams.workload import TENANT, WRITER_TABLE

# A failed transaction is written again after this pause, for at most this long in all: a
# server that is not back by then is the row's failure.
RETRY_PAUSE_S = 0.2
RETRY_FOR_S = 120.0
# What a lost database looks like to a writer: the store's own error, or psycopg's from the
# middle of a statement on a connection that died.
LOST = (Unreachable, psycopg.OperationalError, psycopg.InterfaceError)


@dataclass
class WriteTally:
    """What the writers did, over every wave."""

    writes: int = 0  # transactions committed
    events: int = 0  # events that got a slot
    duplicates: int = 0  # events an outbox already held (a retried commit that had landed)
    retries: int = 0  # transactions written again after the database was lost

    def __post_init__(self) -> None:
        self._lock = threading.Lock()

    def add(self, writes: int, events: int, duplicates: int, retries: int) -> None:
        with self._lock:
            self.writes += writes
            self.events += events
            self.duplicates += duplicates
            self.retries += retries


def _upsert(mark: str) -> str:
    return (
        "INSERT INTO synthetic_writer_state (writer, project_id, last_slot, writes) "
        f"VALUES ({mark}, {mark}, {mark}, 1) ON CONFLICT (writer, project_id) DO UPDATE SET "
        "last_slot = excluded.last_slot, writes = synthetic_writer_state.writes + 1"
    )


def _chunks(drafts: Sequence[Draft], size: int) -> Iterator[tuple[str, list[Draft]]]:
    """Up to ``size`` drafts of one project at a time, projects taken in turn."""
    queues: dict[str, deque[Draft]] = {}
    for draft in drafts:
        queues.setdefault(draft.project_id, deque()).append(draft)
    while queues:
        for project_id in list(queues):
            queue = queues[project_id]
            yield project_id, [queue.popleft() for _ in range(min(size, len(queue)))]
            if not queue:
                del queues[project_id]


def prepare(store: OutboxStore) -> None:
    """The writers' own table, made once before the first wave."""
    with store.transaction() as unit:
        unit.execute(WRITER_TABLE)


def write(
    store: OutboxStore,
    drafts: Sequence[Draft],
    tally: WriteTally,
    *,
    writers: int,
    events_per_write: int,
    hold_s: float = 0.0,
) -> None:
    """Write ``drafts`` with ``writers`` concurrent writer threads, retrying what the database's
    loss failed; each transaction stays open ``hold_s`` before it commits."""
    shares: dict[int, list[Draft]] = {}
    owner: dict[str, int] = {}
    for draft in drafts:
        shares.setdefault(owner.setdefault(draft.project_id, len(owner) % writers), []).append(
            draft
        )

    def one(writer: int) -> None:
        name = f"writer-{writer}"
        seen: dict[str, int] = {}
        writes = events = duplicates = retries = 0
        for project_id, batch in _chunks(shares.get(writer, []), events_per_write):
            deadline = time.monotonic() + RETRY_FOR_S
            while True:
                try:
                    with store.transaction() as unit:
                        result = unit.append(
                            project_id, batch, tenant_id=TENANT, seen_slot=seen.get(project_id)
                        )
                        unit.execute(_upsert(unit.placeholder), (name, project_id, result.head))
                        time.sleep(hold_s)
                    break
                except LOST:
                    if time.monotonic() > deadline:
                        raise
                    retries += 1
                    time.sleep(RETRY_PAUSE_S)
            seen[project_id] = result.head
            writes += 1
            events += len(result.events)
            duplicates += len(result.duplicates)
        tally.add(writes, events, duplicates, retries)

    with ThreadPoolExecutor(max_workers=writers, thread_name_prefix="chaos-writer") as pool:
        list(pool.map(one, range(writers)))
