"""The one dead-letter store, for event batches, poison records and commands.

A dead letter is durable on the Kafka topic ``rhumbatron_dead_letters_<env>`` — a tee, not a
swallow: each entry's original bytes and headers, plus headers of ours (streams.headers) naming
the letter, the error, the error type, the source and the attempts; an original header under one
of those names gives way to the letter's, so each name has one value — and indexed in Redis for
listing and operator state (open → retried | dismissed, each transition audited with who, when,
why). The index keeps every entry's headers exactly as they came.

Writing is idempotent on the dead letter's id: the index keeps the first, and the topic is
compacted on ``<id>:<offset>`` so a repeated write collapses. If the write fails, it raises and the
caller commits nothing.

A stream may hold a record the dead-letter topic cannot take with the letter's headers added (a
producer not ours, allowed up to the broker's limit, above what ours send). Refused, the write
would fail on every try and stop the partition for good; so an entry whose record would pass
``record_max_bytes`` goes to the topic with the letter's headers and ``rh.dead_letter_cut``
(the sizes left out) instead of its value and headers, and the index keeps it whole.
"""

from __future__ import annotations

import base64
import hashlib
import threading
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any, Protocol, cast

import orjson
import redis

from consumers.redis_conn import redis_errors
from consumers.runtime.audit_records import (
    DurableAudit,
    MemoryAudit,
    letter_records,
    transition_record,
)
from consumers.runtime.types import Record
from streams.envelopes import Event, format_time
from streams.errors import DeliveryFailed, FailedRecord
from streams.headers import (
    ATTEMPTS,
    DEAD_LETTER_CUT,
    DEAD_LETTER_ID,
    DEAD_LETTER_KIND,
    ERROR,
    ERROR_TYPE,
    ORIGIN_OFFSET,
    ORIGIN_PARTITION,
    ORIGIN_QUEUE,
    ORIGIN_TOPIC,
    SUBSCRIPTION,
)
from streams.producer import Producer


class LetterStatus(StrEnum):
    """Where a dead letter is: open → retrying → retried, or open → dismissed."""

    OPEN = "open"
    RETRYING = "retrying"  # an operator's retry is being sent; back to open if the send fails
    RETRIED = "retried"
    DISMISSED = "dismissed"


class LetterKind(StrEnum):
    """What a dead letter holds (its ``dlq.kind`` header)."""

    EVENT_BATCH = "event-batch"  # a subscription's batch that failed max_batch_failures times
    POISON = "poison"  # bytes that never decoded: only dismissed, never retried
    COMMAND = "command"  # a command that used up its deliveries on its queue


@dataclass
class Entry:
    """One record inside a dead letter, with its original bytes."""

    offset: int
    value: bytes | None
    key: bytes | None = None
    # As the record came: Kafka allows a header without a value (None), and a name more than once.
    headers: list[tuple[str, bytes | None]] = field(default_factory=list)
    event_id: str | None = None
    event_type: str | None = None
    project_id: str | None = None

    @classmethod
    def of(cls, record: Record, event: Event | None = None, *, offset: int | None = None) -> Entry:
        """A record's entry: its bytes and headers as they were, and the event it decoded to."""
        return cls(
            offset=record.offset if offset is None else offset,
            value=record.value,
            key=record.key,
            headers=list(record.headers),
            event_id=event.event_id if event else None,
            event_type=event.event_type if event else None,
            project_id=event.project_id if event else None,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "offset": self.offset,
            "value_b64": base64.b64encode(self.value).decode() if self.value is not None else None,
            "key_b64": base64.b64encode(self.key).decode() if self.key is not None else None,
            "headers": [
                [k, base64.b64encode(v).decode() if v is not None else None]
                for k, v in self.headers
            ],
            "event_id": self.event_id,
            "event_type": self.event_type,
            "project_id": self.project_id,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Entry:
        return cls(
            offset=d["offset"],
            value=base64.b64decode(d["value_b64"]) if d.get("value_b64") is not None else None,
            key=base64.b64decode(d["key_b64"]) if d.get("key_b64") is not None else None,
            headers=[
                (k, base64.b64decode(v) if v is not None else None) for k, v in d.get("headers", [])
            ],
            event_id=d.get("event_id"),
            event_type=d.get("event_type"),
            project_id=d.get("project_id"),
        )


@dataclass
class DeadLetter:
    id: str
    kind: LetterKind
    source_topic: str
    source_partition: int
    error: str
    error_type: str
    attempts: int
    created_at: str
    entries: list[Entry]
    subscription: str | None = None
    origin_queue: str | None = None
    command_id: str | None = None
    status: LetterStatus = LetterStatus.OPEN
    audit: list[dict[str, str]] = field(default_factory=list)

    @property
    def offsets(self) -> list[int]:
        return [e.offset for e in self.entries]

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["entries"] = [e.to_json() for e in self.entries]
        d["offsets"] = self.offsets
        return d

    def summary(self) -> dict[str, Any]:
        """What a listing shows (no payload bytes)."""
        return {
            "id": self.id,
            "kind": self.kind,
            "status": self.status,
            "subscription": self.subscription,
            "origin_queue": self.origin_queue,
            "command_id": self.command_id,
            "source": f"{self.source_topic}[{self.source_partition}]",
            "offsets": self.offsets,
            "events": [e.event_id for e in self.entries],
            "error_type": self.error_type,
            "error": self.error,
            "attempts": self.attempts,
            "created_at": self.created_at,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> DeadLetter:
        d = dict(d)
        d.pop("offsets", None)
        d["entries"] = [Entry.from_json(e) for e in d["entries"]]
        d["kind"] = LetterKind(d["kind"])
        d["status"] = LetterStatus(d["status"])
        return cls(**d)


def batch_letter_id(subscription: str, topic: str, partition: int, offset: int, tag: str) -> str:
    """A stable id for a letter of the record at ``offset``; ``tag`` tells apart letters of the
    same record (``poison``, ``event-batch-<batch key>``, ``refold``)."""
    raw = f"{tag}\x00{subscription}\x00{topic}\x00{partition}\x00{offset}"
    return "dl_" + hashlib.sha256(raw.encode()).hexdigest()[:24]


def command_letter_id(command_id: str) -> str:
    return "dl_" + hashlib.sha256(f"command\x00{command_id}".encode()).hexdigest()[:24]


class DeadLetterStore(Protocol):
    def write(self, letters: Sequence[DeadLetter]) -> None: ...

    def get(self, letter_id: str) -> DeadLetter | None: ...

    def list(
        self, *, status: LetterStatus | None = None, limit: int = 1000, newest_first: bool = False
    ) -> list[DeadLetter]: ...

    def transition(
        self,
        letter_id: str,
        *,
        to: LetterStatus,
        who: str,
        why: str,
        now: datetime,
        frm: LetterStatus = LetterStatus.OPEN,
    ) -> bool:
        """``frm`` → ``to``, audited; False (and nothing changes) unless the letter is in
        ``frm``. Check-and-set: of two concurrent callers one wins."""


class MemoryDeadLetters:
    """The store's twin for the runtime's and the operator's tests. Like the Redis index it keeps
    its own copy of every letter (through the same JSON a real write stores), orders a listing by
    creation time then id, and fails a write with the error the real store raises."""

    def __init__(self, audit: MemoryAudit | None = None, *, part_max_bytes: int = 900_000) -> None:
        self.letters: dict[str, DeadLetter] = {}
        self.writes = 0
        self.fail_next_write = False
        self.audit = audit if audit is not None else MemoryAudit()
        self.part_max_bytes = part_max_bytes
        self._lock = threading.Lock()

    def write(self, letters: Sequence[DeadLetter]) -> None:
        with self._lock:
            if self.fail_next_write:
                self.fail_next_write = False
                raise DeliveryFailed(
                    [FailedRecord("dead-letters", None, "injected write failure", True, False)]
                )
            fresh = [letter for letter in letters if letter.id not in self.letters]
            self.audit.write(indexed_records(fresh, self.part_max_bytes))
            for letter in letters:
                self.letters.setdefault(letter.id, _copy(letter))
            self.writes += 1

    def put(self, letter: DeadLetter) -> None:
        """What a rebuild writes (consumers/runtime/state_rebuild.py)."""
        with self._lock:
            self.letters[letter.id] = _copy(letter)

    def get(self, letter_id: str) -> DeadLetter | None:
        letter = self.letters.get(letter_id)
        return _copy(letter) if letter is not None else None

    def list(
        self, *, status: LetterStatus | None = None, limit: int = 1000, newest_first: bool = False
    ) -> list[DeadLetter]:
        out = [d for d in self.letters.values() if status is None or d.status == status]
        # The Redis index: scored by creation time, members of equal score ordered by id.
        out.sort(key=lambda d: (_score(d.created_at), d.id), reverse=newest_first)
        return [_copy(d) for d in out[: max(limit, 0)]]

    def transition(
        self,
        letter_id: str,
        *,
        to: LetterStatus,
        who: str,
        why: str,
        now: datetime,
        frm: LetterStatus = LetterStatus.OPEN,
    ) -> bool:
        with self._lock:
            letter = self.letters.get(letter_id)
            if letter is None or letter.status != frm:
                return False
            entry = {"action": to.value, "who": who, "why": why, "at": format_time(now)}
            self.audit.write([transition_record(letter_id, len(letter.audit), frm, to, entry)])
            letter.status = to
            letter.audit.append(entry)
            return True


class KafkaRedisDeadLetters:
    """The durable record on the dead-letter topic, the index in Redis, and the index's own
    durable copy (each letter as indexed, each status change) on the audit topic."""

    def __init__(
        self,
        producer: Producer,
        client: redis.Redis[bytes],
        *,
        env: str,
        topic: str,
        flush_timeout: float,
        reason_max_bytes: int,
        record_max_bytes: int,
        audit: DurableAudit,
    ) -> None:
        self.producer = producer
        self.audit = audit
        self.client = client
        self.topic = topic
        self.flush_timeout = flush_timeout
        self.reason_max_bytes = reason_max_bytes  # the rh.error header; the index keeps it all
        self.record_max_bytes = record_max_bytes  # one record on the topic; the index keeps it all
        self.prefix = f"rh:{env}:{{dead-letters}}:"

    def _record_key(self, letter_id: str) -> str:
        return self.prefix + "record:" + letter_id

    def write(self, letters: Sequence[DeadLetter]) -> None:
        # Only a letter the index does not hold yet goes to the audit topic: the index keeps the
        # first write of an id, and a rebuild takes the last copy there.
        held = self.client.pipeline(transaction=False)
        for letter in letters:
            held.exists(self._record_key(letter.id))
        fresh = [letter for letter, n in zip(letters, held.execute(), strict=True) if not n]
        for letter in letters:
            for entry in letter.entries:
                ours: list[tuple[str, bytes | None]] = [
                    (DEAD_LETTER_ID, letter.id.encode()),
                    (DEAD_LETTER_KIND, letter.kind.encode()),
                    (ERROR, letter.error.encode()[: self.reason_max_bytes]),
                    (ERROR_TYPE, letter.error_type.encode()),
                    (ATTEMPTS, str(letter.attempts).encode()),
                    (ORIGIN_TOPIC, letter.source_topic.encode()),
                    (ORIGIN_PARTITION, str(letter.source_partition).encode()),
                    (ORIGIN_OFFSET, str(entry.offset).encode()),
                ]
                if letter.subscription:
                    ours.append((SUBSCRIPTION, letter.subscription.encode()))
                if letter.origin_queue:
                    ours.append((ORIGIN_QUEUE, letter.origin_queue.encode()))
                # A command's entry already carries rh.error, rh.origin_* … from the worker's
                # dead letter: the letter's values replace them rather than repeat the names.
                stated = {name for name, _ in ours}
                theirs = [h for h in entry.headers if h[0] not in stated]
                value = entry.value if entry.value is not None else b""
                key = f"{letter.id}:{entry.offset}"
                if _size(value, key, theirs + ours) > self.record_max_bytes:
                    cut = f"value {len(value)} bytes, headers {_size(b'', '', theirs)} bytes"
                    theirs, value = [], b""
                    ours.append((DEAD_LETTER_CUT, cut.encode()))
                self.producer.produce(self.topic, value, key=key, headers=theirs + ours)
        self.producer.flush(self.flush_timeout)  # raises DeliveryFailed: the caller commits nothing
        self.audit.write(indexed_records(fresh, self.record_max_bytes))  # or AuditNotDurable
        pipe = self.client.pipeline(transaction=True)
        for letter in letters:
            pipe.set(self._record_key(letter.id), orjson.dumps(letter.to_json()), nx=True)
            pipe.zadd(self.prefix + "index", {letter.id: _score(letter.created_at)}, nx=True)
        pipe.execute()

    # get, list and transition answer the operator's faces: a Redis error becomes one of ours
    # here. write stays raw: the runtime's and the workers' retry policies take it as it is.
    def get(self, letter_id: str) -> DeadLetter | None:
        with redis_errors(self.client, f"reading dead letter {letter_id!r}"):
            raw = self.client.get(self._record_key(letter_id))
        return DeadLetter.from_json(orjson.loads(raw)) if raw else None

    def list(
        self, *, status: LetterStatus | None = None, limit: int = 1000, newest_first: bool = False
    ) -> list[DeadLetter]:
        index = self.prefix + "index"
        out: list[DeadLetter] = []
        with redis_errors(self.client, f"listing the dead letters ({index})"):
            found = (
                self.client.zrevrange(index, 0, -1)
                if newest_first
                else self.client.zrange(index, 0, -1)
            )
            ids = [i.decode() for i in found]
            if limit <= 0:
                return out
            for chunk in range(0, len(ids), 200):
                part = ids[chunk : chunk + 200]
                for raw in self.client.mget([self._record_key(i) for i in part]):
                    if raw:
                        letter = DeadLetter.from_json(orjson.loads(raw))
                        if status is None or letter.status == status:
                            out.append(letter)
                            if len(out) >= limit:
                                return out
        return out

    def transition(
        self,
        letter_id: str,
        *,
        to: LetterStatus,
        who: str,
        why: str,
        now: datetime,
        frm: LetterStatus = LetterStatus.OPEN,
    ) -> bool:
        key = self._record_key(letter_id)
        with (
            redis_errors(self.client, f"marking dead letter {letter_id!r} {to.value}"),
            self.client.pipeline(transaction=True) as pipe,
        ):
            while True:
                try:
                    pipe.watch(key)  # check-and-set: of two clicks, one wins
                    raw = cast(bytes | None, pipe.get(key))
                    if not raw:
                        return False
                    letter = DeadLetter.from_json(orjson.loads(raw))
                    if letter.status != frm:
                        return False
                    entry = {"action": to.value, "who": who, "why": why, "at": format_time(now)}
                    change = transition_record(letter_id, len(letter.audit), frm, to, entry)
                    self.audit.write([change])  # durable first; AuditNotDurable leaves Redis be
                    letter.status = to
                    letter.audit.append(entry)
                    pipe.multi()
                    pipe.set(key, orjson.dumps(letter.to_json()))
                except redis.WatchError:
                    continue
                try:
                    pipe.execute()
                    return True
                except redis.WatchError:
                    # Someone changed the letter meanwhile: this change did not happen.
                    self.audit.void([change[0]])


def indexed_records(
    letters: Sequence[DeadLetter], part_max_bytes: int
) -> list[tuple[str, dict[str, Any]]]:
    """The audit topic's copy of ``letters`` as the index stores them."""
    return [
        record
        for letter in letters
        for record in letter_records(letter.id, orjson.dumps(letter.to_json()), part_max_bytes)
    ]


def _size(value: bytes, key: str, headers: Sequence[tuple[str, bytes | None]]) -> int:
    """A record's bytes as the producer's message.max.bytes counts them, near enough."""
    return len(value) + len(key) + sum(len(k.encode()) + len(v or b"") + 8 for k, v in headers)


def _copy(letter: DeadLetter) -> DeadLetter:
    return DeadLetter.from_json(orjson.loads(orjson.dumps(letter.to_json())))


def _score(created_at: str) -> float:
    return datetime.strptime(created_at, "%Y-%m-%dT%H:%M:%S.%fZ").timestamp()
