"""Records no producer of ours writes, for writing straight onto a stream with a raw producer:
values that are not an event (garbage, nothing, JSON of another shape, an event cut short or
with a bad field, nesting deeper than a parser goes or than an envelope may, an event over
``max_envelope_bytes``), with headers Kafka allows (a name with no value, bytes that are not
UTF-8, a name given twice, our own names carrying lies, one huge value). Every one of them must
be dead-lettered as poison by each subscription reading its stream, once, holding its bytes and
headers as they came.

Used by the Kafka test of the runtime (tests/consumers/runtime/test_hostile_records_kafka.py)
and the chaos matrix's row 9.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, cast

import orjson
from confluent_kafka import KafkaError, Message, Producer

from streams.envelopes import Event, build, encode
from streams.headers import EVENT_ID, EVENT_TYPE, ORIGIN_OFFSET, PREFIX
from streams.ids import new_event_id
from streams.tracing import TRACEPARENT, TRACESTATE

HeaderList = list[tuple[str, bytes | None]]
# What a raw producer may send: the broker's default record limit, well over our producers'
# max_envelope_bytes, as a producer that is not ours may be configured.
RAW_MAX_BYTES = 1_040_000


@dataclass(frozen=True)
class Hostile:
    name: str
    value: bytes | None
    headers: HeaderList


def _event(project_id: str) -> bytes:
    return encode(
        build(
            Event,
            event_id=new_event_id(),
            event_type="task.completed",
            tenant_id="hostile",
            project_id=project_id,
            actor="nobody",
            timestamp=datetime(2026, 1, 1, tzinfo=UTC),
            payload={"agentId": "a"},
            slot=1,
        ),
        max_bytes=1 << 20,
    )


def catalog(project_id: str, max_envelope_bytes: int) -> list[Hostile]:
    """The hostile records, each keyed (partitioned) by ``project_id`` by the writer."""
    valid = _event(project_id)
    bad_field = orjson.loads(valid) | {"eventId": "evt_nope"}
    deep = b'{"eventId":' + b"[" * 5000 + b"]" * 5000 + b"}"
    nested = orjson.loads(valid) | {"payload": {"deep": orjson.Fragment(b"[" * 300 + b"]" * 300)}}
    over = orjson.loads(valid) | {"payload": {"blob": "x" * max_envelope_bytes}}
    return [
        Hostile("garbage", b"\xff\x00\x13 not an event \xfe", []),
        Hostile("empty", b"", []),
        Hostile("no-value", None, []),
        Hostile("json-array", b"[1, 2, 3]", []),
        Hostile("cut-short", valid[: len(valid) // 2], []),
        Hostile("bad-field", orjson.dumps(bad_field), []),
        Hostile("deep", deep, []),
        Hostile("nested-past-the-writer", orjson.dumps(nested), []),
        Hostile("over-the-limit", orjson.dumps(over), []),
        Hostile(
            "headers-without-values",
            b"garbage",
            [("note", None), (TRACEPARENT, None), (EVENT_TYPE, None)],
        ),
        Hostile(
            "headers-not-utf8",
            b"garbage",
            [(EVENT_TYPE, b"\xff\xfe"), (EVENT_ID, b"\xc3"), (TRACESTATE, b"\x80\x81")],
        ),
        Hostile(
            "headers-twice",
            b"{}",
            [(EVENT_TYPE, b"task.completed"), (EVENT_TYPE, b"spoof"), ("x", b"1"), ("x", b"2")],
        ),
        Hostile(
            "our-headers-lying",
            b"null",
            [
                (ORIGIN_OFFSET, b"9" * 5000),
                (PREFIX + "dead_letter_id", b"dl_spoofed"),
                (PREFIX + "error", b"spoofed"),
                ("dlq.id", b"spoofed"),
                (TRACEPARENT, b"00-" + b"f" * 32 + b"-" + b"f" * 16 + b"-01"),
            ],
        ),
        Hostile("huge-header", b"garbage", [("blob", b"x" * (max_envelope_bytes + 1000))]),
        Hostile(
            "near-the-raw-limit",
            b"\x00" * (RAW_MAX_BYTES // 2),
            [("blob", b"y" * (RAW_MAX_BYTES // 2 - 4000))],
        ),
    ]


def write(
    bootstrap: str, topic: str, partition: int, key: str, records: list[Hostile]
) -> list[tuple[str, int, int]]:
    """Write ``records`` in order to one partition with a producer of nobody's (no idempotence,
    no envelope checks, the broker's record limit); where each landed (topic, partition,
    offset), in order."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "message.max.bytes": RAW_MAX_BYTES + 10_000,
            "linger.ms": 0,
            "acks": "all",
        }
    )
    failed: list[str] = []
    landed: list[tuple[str, int, int]] = []

    def report(name: str) -> Callable[[KafkaError | None, Message], None]:
        def done(err: KafkaError | None, msg: Message) -> None:
            if err is not None:
                failed.append(f"{name}: {err}")
            else:
                landed.append((msg.topic() or topic, msg.partition() or 0, msg.offset() or 0))

        return done

    for record in records:
        producer.produce(
            topic,
            record.value,
            key=key.encode(),
            partition=partition,
            headers=cast(Any, record.headers),  # confluent-kafka's stub has no None values
            on_delivery=report(record.name),
        )
        producer.flush(30)  # one at a time: their order on the partition is the list's
    if failed or len(producer) > 0 or len(landed) != len(records):
        raise AssertionError(f"hostile records not written: {failed or len(producer)}")
    return landed


def headers_of(message: Message) -> HeaderList:
    """A consumed record's headers, as :data:`HeaderList`."""
    return cast(HeaderList, message.headers() or [])
