"""The first consume loop (poll → decode → handle → commit), for reads that need no claims.

Its consumer's config is built where every client's is, :func:`streams.kafka_config.client_config`.
Each event reaches ``handle`` upcast to the newest version of its type ``catalog`` knows, as the
subscription runtime hands it to a processor (``consumers.runtime.versions``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import confluent_kafka
from confluent_kafka import KafkaError, KafkaException, Message

from streams.catalog import CATALOG, Catalog
from streams.envelopes import Event, decode_event
from streams.errors import EnvelopeError, Unreachable
from streams.kafka_config import bootstrap_of, client_config

log = logging.getLogger("rhumbatron.consumer")


@dataclass
class LoopStats:
    consumed: int = 0
    handled: int = 0
    rejected: int = 0
    batches: int = 0
    by_topic: dict[str, int] = field(default_factory=dict)


EventHandler = Callable[[Event, Message], None]
RejectHandler = Callable[[Message, EnvelopeError], None]


def drain(
    base: Mapping[str, Any],
    *,
    group_id: str,
    topics: list[str],
    handle: EventHandler,
    reject: RejectHandler,
    protocol: str,
    session_timeout_ms: int,
    max_envelope_bytes: int,
    batch_size: int,
    until_idle_s: float,
    join_timeout_s: float,
    until: Callable[[], bool] = lambda: False,
    max_wait_s: float | None = None,
    catalog: Catalog = CATALOG,
) -> LoopStats:
    """Consume ``topics`` as ``group_id`` until nothing arrives for ``until_idle_s`` (or ``until()``
    says stop). Offsets are committed after each batch is handled, so a crash re-delivers (never
    loses) the batch it was in. With no partition assigned ``until_idle_s + join_timeout_s`` after
    the start, Kafka is reported unreachable."""
    consumer = confluent_kafka.Consumer(
        client_config(
            base,
            "consumer",
            group_id=group_id,
            protocol=protocol,
            session_timeout_ms=session_timeout_ms,
        )
    )
    stats = LoopStats()
    started = time.monotonic()
    last_activity = started
    try:
        consumer.subscribe(topics)
        while not until():
            now = time.monotonic()
            if max_wait_s is not None and now - started > max_wait_s:
                break
            messages = consumer.consume(batch_size, timeout=0.5)
            if not messages:
                if now - last_activity > until_idle_s and consumer.assignment():
                    break
                if not consumer.assignment() and now - started > until_idle_s + join_timeout_s:
                    raise Unreachable(
                        "Kafka", bootstrap_of(base), f"no partitions assigned to {group_id} in time"
                    )
                continue
            last_activity = time.monotonic()
            stats.batches += 1
            for message in messages:
                error = message.error()
                if error is not None:
                    if error.fatal() or error.code() == KafkaError._FATAL:
                        raise KafkaException(error)
                    log.warning("consumer error on %s: %s", message.topic(), error.str())
                    continue
                stats.consumed += 1
                topic = message.topic() or "?"
                stats.by_topic[topic] = stats.by_topic.get(topic, 0) + 1
                try:
                    event = decode_event(message.value(), max_bytes=max_envelope_bytes)
                except EnvelopeError as exc:
                    stats.rejected += 1
                    reject(message, exc)
                    continue
                handle(catalog.upcast(event), message)
                stats.handled += 1
                consumer.store_offsets(message)
            for message in messages:  # rejected records are handed to `reject`: move past them too
                if message.error() is None:
                    consumer.store_offsets(message)
            _commit(consumer)
    except KafkaException as exc:
        raise Unreachable("Kafka", bootstrap_of(base), exc.args[0].str()) from exc
    finally:
        consumer.close()
    return stats


def _commit(consumer: confluent_kafka.Consumer) -> None:
    try:
        consumer.commit(asynchronous=False)
    except KafkaException as exc:
        if exc.args[0].code() != KafkaError._NO_OFFSET:
            raise
