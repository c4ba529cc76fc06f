"""The one place a librdkafka configuration is built, for every client Rhumbatron makes.

A client's dict is laid down in four layers, each over the one before:

1. the role's **tuning defaults** (a producer's ``linger.ms`` and ``compression.type``, ...);
2. the **base**: how to reach the cluster (``bootstrap.servers``, ``security.protocol``, SASL and
   SSL properties) and the operator's pass-through properties — ``router.settings`` builds it
   (``Settings.kafka_config``), so a pass-through property wins over a tuning default;
3. the role's **guarantees**: what exactly-once and ordering rest on (idempotence, ``acks=all``,
   read_committed, manual commits, the transactional id, the partitioner ...). Nothing overrides
   these, and the settings refuse a pass-through of any of them (:data:`GUARANTEED`) rather than
   letting it be ignored;
4. the caller's **extra**: values it derived from its own settings (the publisher's linger, a
   transaction timeout, a consumer's poll interval).

Roles: ``admin`` (AdminClient), ``producer``, ``consumer`` (a group member: subscribe, commit)
and ``reader`` (manual assignment, never commits; librdkafka still wants a group id).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from typing import Any, Literal

from confluent_kafka import KafkaError

Role = Literal["admin", "producer", "consumer", "reader"]

# librdkafka logs every refused connection; route it through logging, not stderr.
LIBRDKAFKA_LOGGER = logging.getLogger("rhumbatron.librdkafka")

# What each role tunes by default; a pass-through property replaces any of these.
_DEFAULTS: dict[Role, dict[str, Any]] = {
    "admin": {},
    "producer": {"compression.type": "lz4", "linger.ms": 5},
    "consumer": {},
    "reader": {},
}

# Properties the guarantees rest on, per role (group, protocol and transactional id are added
# by the builder); the union is refused as a pass-through.
_GUARANTEES: dict[Role, dict[str, Any]] = {
    "admin": {},
    "producer": {
        "acks": "all",
        "enable.idempotence": True,
        # Java's partitioner: a producer in any language puts a key on the same partition.
        "partitioner": "murmur2_random",
    },
    "consumer": {
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        "enable.partition.eof": False,
    },
    "reader": {
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        "isolation.level": "read_committed",
    },
}

GUARANTEED: frozenset[str] = frozenset(
    {
        *(name for properties in _GUARANTEES.values() for name in properties),
        "request.required.acks",  # librdkafka's other name for acks
        "isolation.level",
        "group.id",
        "group.instance.id",
        "group.protocol",
        "partition.assignment.strategy",  # the runtime uses the incremental (cooperative) API
        "transactional.id",
        "enable.gapless.guarantee",
        "max.in.flight.requests.per.connection",
    }
)


def client_config(
    base: Mapping[str, Any],
    role: Role = "admin",
    *,
    group_id: str | None = None,
    protocol: str = "classic",
    session_timeout_ms: int = 10_000,
    isolation: str = "read_committed",
    transactional_id: str | None = None,
    gapless: bool = False,
    instance_id: str | None = None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A client's whole librdkafka dict, in the layers the module docstring gives.

    ``consumer``: ``group_id`` is required; ``protocol`` is ``classic`` (cooperative-sticky,
    session and heartbeat set here) or ``consumer`` (KIP-848: the broker holds those, and the
    client refuses them); ``instance_id`` makes it a static member (``group.instance.id``).
    ``reader``: a random group id unless one is given. ``producer``:
    ``transactional_id`` makes it transactional; ``gapless`` fails every later in-flight record
    of a partition with a failed one, so a retry can never land behind its successor.
    """
    config: dict[str, Any] = {"logger": LIBRDKAFKA_LOGGER, **_DEFAULTS[role], **base}
    config.update(_GUARANTEES[role])
    if role == "producer":
        if gapless:
            config["enable.gapless.guarantee"] = True
        if transactional_id is not None:
            config["transactional.id"] = transactional_id
    elif role == "consumer":
        if group_id is None:
            raise ValueError("a consumer needs a group id")
        config["group.id"] = group_id
        config["isolation.level"] = isolation
        config.update(_group_protocol(protocol, session_timeout_ms))
        if instance_id is not None:
            config["group.instance.id"] = instance_id
    elif role == "reader":
        config["group.id"] = group_id or f"rhumbatron-reader-{uuid.uuid4().hex[:12]}"
    if extra:
        config.update(extra)
    return config


def _group_protocol(protocol: str, session_timeout_ms: int) -> dict[str, Any]:
    if protocol == "consumer":
        return {"group.protocol": "consumer"}
    if protocol == "classic":
        return {
            "group.protocol": "classic",
            "partition.assignment.strategy": "cooperative-sticky",
            "session.timeout.ms": session_timeout_ms,
            "heartbeat.interval.ms": max(session_timeout_ms // 5, 500),
        }
    raise ValueError(f"group protocol must be 'classic' or 'consumer', got {protocol!r}")


def reader_reads_on(error: KafkaError) -> bool:
    """Whether a ``reader`` may ignore ``error`` and read on: librdkafka looks up the coordinator
    of the reader's group, which it never joins or commits with, so a login without rights on that
    (random) name is refused a lookup that nothing needs."""
    return error.code() == KafkaError.GROUP_AUTHORIZATION_FAILED


def bootstrap_of(base: Mapping[str, Any]) -> str:
    return str(base.get("bootstrap.servers", "?"))


def listener_of(base: Mapping[str, Any]) -> str:
    """The address a client reaches, with how it logs in when it does (never a secret):
    ``127.0.0.1:10092 (SASL_SSL, SCRAM-SHA-512, user rh-app)``."""
    protocol = str(base.get("security.protocol", "PLAINTEXT")).upper()
    if protocol == "PLAINTEXT":
        return bootstrap_of(base)
    parts = [protocol]
    if protocol.startswith("SASL"):
        parts.append(str(base.get("sasl.mechanism", base.get("sasl.mechanisms", "GSSAPI"))))
        if "sasl.username" in base:
            parts.append(f"user {base['sasl.username']}")
    return f"{bootstrap_of(base)} ({', '.join(parts)})"
