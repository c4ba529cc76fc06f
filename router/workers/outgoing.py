"""The records a worker sends for a command: its retry (with a due time), its next delivery, its
dead letter. Each carries the command's original bytes and headers, minus the headers of ours
that are written afresh."""

from __future__ import annotations

from consumers.runtime.types import OutRecord, Record
from router.workers.model import (
    ATTEMPT,
    ATTEMPTS,
    DUE_MS,
    ERROR,
    ERROR_TYPE,
    ORIGIN_OFFSET,
    ORIGIN_PARTITION,
    ORIGIN_QUEUE,
    ORIGIN_TOPIC,
    REASON,
    WorkerPolicy,
)
from streams.envelopes import Command

# Headers of ours a record does not carry into its retry, next delivery or dead letter (they are
# written afresh); the operator-retry marker ``rh.dead_letter`` itself is carried.
_REWRITTEN = ("rh.retry.", "rh.error", "rh.origin_", "rh.dead_letter_", "record_id")


def carried(record: Record) -> list[tuple[str, bytes]]:
    return [(k, v) for k, v in record.headers if not k.startswith(_REWRITTEN)]


def error_headers(policy: WorkerPolicy, error: BaseException) -> list[tuple[str, bytes]]:
    text = str(error).encode("utf-8", "replace")[: policy.error_max_bytes]
    return [(ERROR, text), (ERROR_TYPE, type(error).__name__.encode())]


def retry_record(
    policy: WorkerPolicy,
    record: Record,
    command: Command,
    attempt: int,
    error: BaseException,
    now_ms: int,
) -> OutRecord:
    """The next attempt, on the retry topic, due ``retry_delay_s`` from now."""
    due_ms = now_ms + int(policy.retry_delay_s * 1000)
    headers = carried(record) + [
        (ATTEMPT, str(attempt).encode()),
        (DUE_MS, str(due_ms).encode()),
        *error_headers(policy, error),
    ]
    return OutRecord(
        topic=policy.retry_topic,
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
        (REASON, reason.encode()),
    ]
    return OutRecord(
        topic=topic,
        key=key,
        value=record.value or b"",
        record_id=f"dead-letter:{record.topic}:{record.partition}:{record.offset}",
        headers=tuple(headers),
    )
