"""The records a worker sends for a command: its retry (with a due time), its next delivery, its
dead letter, the follow-up commands its handler sent. Each carries the command's original bytes and headers, minus the headers of ours
that are written afresh."""

from __future__ import annotations

import msgpack  # type: ignore[import-untyped]

from consumers.runtime.types import OutRecord, Record
from router.workers.model import WorkerPolicy
from streams.envelopes import Command, encode
from streams.headers import (
    ATTEMPT,
    ATTEMPTS,
    DEAD_LETTER_REASON,
    DUE_MS,
    ERROR,
    ERROR_TYPE,
    OPERATOR_RETRY,
    ORIGIN_OFFSET,
    ORIGIN_PARTITION,
    ORIGIN_QUEUE,
    ORIGIN_TOPIC,
    RECORD_ID,
    is_ours,
)
from streams.producer import command_headers
from streams.topology import queue_name


def carried(record: Record) -> list[tuple[str, bytes]]:
    """The headers a record carries into its retry, next delivery or dead letter: not those of
    ours (written afresh) nor the runtime's effect id (the send gets its own), but the operator's
    retry marker, which the dead-letter consumer needs should the command fail again."""
    return [
        (k, v)
        for k, v in record.headers
        if k == OPERATOR_RETRY or not (is_ours(k) or k == RECORD_ID)
    ]


def _error_bytes(policy: WorkerPolicy, error: BaseException) -> bytes:
    return str(error).encode("utf-8", "replace")[: policy.error_max_bytes]


def error_headers(policy: WorkerPolicy, error: BaseException) -> list[tuple[str, bytes]]:
    return [(ERROR, _error_bytes(policy, error)), (ERROR_TYPE, type(error).__name__.encode())]


def error_text(policy: WorkerPolicy, error: BaseException) -> str:
    """The error's text as its retry or dead letter carries it (``rh.error``), read back as the
    dead-letter consumer reads it."""
    return _error_bytes(policy, error).decode("utf-8", "replace")


def retry_record(
    policy: WorkerPolicy,
    record: Record,
    command: Command,
    attempt: int,
    error: BaseException,
    now_ms: int,
    *,
    topic: str | None = None,
    delay_s: float | None = None,
) -> OutRecord:
    """The next attempt, on the retry topic (``topic``: a retry tier's), due ``retry_delay_s``
    (``delay_s``: the tier's delay) from now."""
    due_ms = now_ms + int((policy.retry_delay_s if delay_s is None else delay_s) * 1000)
    headers = carried(record) + [
        (ATTEMPT, str(attempt).encode()),
        (DUE_MS, str(due_ms).encode()),
        *error_headers(policy, error),
    ]
    return OutRecord(
        topic=topic or policy.retry_topic,
        key=command.project_id,
        value=record.value or b"",
        record_id=f"{command.command_id}:attempt:{attempt}",
        headers=tuple(headers),
    )


def next_delivery(
    policy: WorkerPolicy, record: Record, command: Command, delivery: int
) -> OutRecord:
    """A command with more work, back at the tail of its own queue."""
    headers = carried(record) + [(ATTEMPT, str(delivery).encode())]
    return OutRecord(
        topic=policy.queue_topic,
        key=command.project_id,
        value=record.value or b"",
        record_id=f"{command.command_id}:delivery:{delivery}",
        headers=tuple(headers),
    )


def dead_letter_record(
    policy: WorkerPolicy,
    record: Record,
    key: str,
    attempts: int,
    error: BaseException,
    reason: str,
) -> OutRecord:
    """The original bytes on the dead-letter queue, with why, how often and whence."""
    topic = policy.dead_letter_topic
    assert topic is not None
    headers = carried(record) + [
        (ATTEMPTS, str(attempts).encode()),
        *error_headers(policy, error),
        (ORIGIN_QUEUE, policy.purpose.encode()),
        (ORIGIN_TOPIC, record.topic.encode()),
        (ORIGIN_PARTITION, str(record.partition).encode()),
        (ORIGIN_OFFSET, str(record.offset).encode()),
        (DEAD_LETTER_REASON, reason.encode()),
    ]
    return OutRecord(
        topic=topic,
        key=key,
        value=record.value or b"",
        record_id=f"dead-letter:{record.topic}:{record.partition}:{record.offset}",
        headers=tuple(headers),
    )


def follow_up_records(policy: WorkerPolicy, sent: list[tuple[str, Command]]) -> list[OutRecord]:
    """A handler's follow-up commands (``ctx.send``), as records for their queues."""
    return [
        OutRecord(
            topic=queue_name(purpose, policy.env),
            key=command.project_id,
            value=encode(command, max_bytes=policy.max_envelope_bytes),
            record_id=command.command_id,
            headers=tuple(command_headers(command)),
        )
        for purpose, command in sent
    ]


def pack_records(place: str, records: list[OutRecord]) -> bytes:
    """The follow-ups of the command completed by the record at ``place``, as the completed-command
    ledger keeps them: sent again should that record be read again before they landed."""
    packed: bytes = msgpack.packb(
        [
            place,
            [[r.topic, r.key, r.value, r.record_id, [list(h) for h in r.headers]] for r in records],
        ]
    )
    return packed


def unpack_records(packed: bytes) -> tuple[str, list[OutRecord]]:
    place, records = msgpack.unpackb(packed)
    return place, [
        OutRecord(
            topic=topic,
            key=key,
            value=value,
            record_id=record_id,
            headers=tuple((k, v) for k, v in headers),
        )
        for topic, key, value, record_id, headers in records
    ]
