"""The operator audit logs (who, when, why of each operator control, per subscription; the pump's
moves), newest first, in Redis at ``rh:<env>:{audit}:<slug>``.

Each entry is first written to the audit topic (consumers/runtime/audit_records.py) and kept in
Redis only once the topic has it; a Redis that lost its data gets the logs back from there
(consumers/runtime/state_rebuild.py).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from functools import partial
from typing import Any, Protocol

import orjson

from consumers.runtime.audit_records import (
    AUDIT_ID,
    DurableAudit,
    MemoryAudit,
    entry_record,
    new_id,
)
from streams.errors import AuditNotDurable


class AuditLog(Protocol):
    """An operator audit log, newest first. Each entry is written to the durable audit topic
    (consumers/runtime/audit_records.py) before it is kept here, and comes back with its
    ``audit_id``, its key there."""

    def append(self, entry: dict[str, Any]) -> None: ...

    def entries(self, limit: int = 100) -> list[dict[str, Any]]: ...

    def recording(self, entry: dict[str, Any]) -> AbstractContextManager[None]:
        """Around the change ``entry`` records: the entry is durable before the block runs (else
        AuditNotDurable, and the block never runs), kept in the log once the block ends, voided
        on the audit topic if the block raises."""


@contextmanager
def _recording(
    durable: DurableAudit | None, log: str, entry: dict[str, Any], keep: Callable[[bytes], None]
) -> Iterator[None]:
    if durable is None:
        raise TypeError(f"the audit log of {log} was opened to read only")
    stored = {**orjson.loads(orjson.dumps(entry)), AUDIT_ID: new_id()}
    key, value = entry_record(log, stored)
    durable.write([(key, value)])
    try:
        yield
    except BaseException as exc:
        try:
            durable.void([key])
        except AuditNotDurable as void_failed:
            exc.add_note(str(void_failed))
        raise
    # Kept after the durable copy: should this write fail, a rebuild restores the entry.
    keep(orjson.dumps(stored))


class MemoryAuditLog:
    """Keeps each entry as the JSON the Redis log stores, so neither the writer nor a reader can
    change it afterwards, and it reads back as Redis gives it. ``durable``: the audit topic's
    twin, shared by the logs and dead-letter twins of one environment."""

    def __init__(self, *, slug: str = "memory", durable: MemoryAudit | None = None) -> None:
        self.slug = slug
        self.durable = durable if durable is not None else MemoryAudit()
        self._entries: list[bytes] = []
        self._lock = threading.Lock()

    def _keep(self, raw: bytes) -> None:
        with self._lock:
            self._entries.append(raw)

    def recording(self, entry: dict[str, Any]) -> AbstractContextManager[None]:
        return _recording(self.durable, self.slug, entry, self._keep)

    def append(self, entry: dict[str, Any]) -> None:
        with self.recording(entry):
            pass

    def entries(self, limit: int = 100) -> list[dict[str, Any]]:
        with self._lock:
            newest = list(reversed(self._entries[-limit:]))
        return [orjson.loads(raw) for raw in newest]

    def replace(self, newest_first: list[dict[str, Any]]) -> None:
        """What a rebuild writes (consumers/runtime/state_rebuild.py)."""
        with self._lock:
            self._entries = [orjson.dumps(e) for e in reversed(newest_first)]


class RedisAuditLog:
    """``durable`` None: a log opened to read only (``append`` refuses)."""

    def __init__(
        self, client: Any, *, env: str, slug: str, durable: DurableAudit | None = None
    ) -> None:
        self.client = client
        self.slug = slug
        self.durable = durable
        self.key = audit_log_key(env, slug)

    def recording(self, entry: dict[str, Any]) -> AbstractContextManager[None]:
        return _recording(self.durable, self.slug, entry, partial(self.client.lpush, self.key))

    def append(self, entry: dict[str, Any]) -> None:
        with self.recording(entry):
            pass

    def entries(self, limit: int = 100) -> list[dict[str, Any]]:
        return [orjson.loads(raw) for raw in self.client.lrange(self.key, 0, limit - 1)]


def audit_log_key(env: str, slug: str) -> str:
    return f"rh:{env}:{{audit}}:{slug}"
