"""A send refused because the producer already had a fatal error (another process took over its
transactional id) is reported as fatal: librdkafka raises ``_FATAL`` ("Local: Fatal error") from
``produce`` with ``fatal()`` false, and the pump and the publisher decide on ``FailedRecord.fatal``
(fenced: give up the producer, not retry the record)."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from streams.errors import DeliveryFailed
from streams.producer import Producer


class _Refusing:
    """A client whose every send is refused with ``error``."""

    def __init__(self, error: KafkaError) -> None:
        self.error = error

    def produce(self, topic: str, **kwargs: Any) -> None:
        raise KafkaException(self.error)


def _refused(error: KafkaError) -> DeliveryFailed:
    producer = Producer({"bootstrap.servers": "127.0.0.1:1"})
    producer._inner = _Refusing(error)  # type: ignore[assignment]
    with pytest.raises(DeliveryFailed) as refused:
        producer.produce("t", b"v", key="k")
    return refused.value


def test_a_send_refused_after_a_fatal_error_is_fatal() -> None:
    [failure] = _refused(KafkaError(KafkaError._FATAL)).failures
    assert failure.fatal and "Fatal error" in failure.error


def test_a_fatal_error_itself_is_fatal_and_an_ordinary_refusal_is_not() -> None:
    assert _refused(KafkaError(KafkaError._FENCED, fatal=True)).failures[0].fatal
    ordinary = _refused(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE)).failures[0]
    assert not ordinary.fatal
