"""Talking to the broker as an administrator: reachability, provisioning, describing topics.

Every call is bounded by a timeout and every librdkafka failure becomes one of our errors naming
the address tried, so a command never hangs on an unreachable broker. A broker that answers but
refuses the login (SASL) or the TLS handshake is told apart from one that does not answer.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    OffsetSpec,
)

from streams.errors import KafkaLoginRefused, TopologyError, Unreachable
from streams.kafka_config import bootstrap_of, client_config, listener_of
from streams.topology import TopicSpec, Topology

log = logging.getLogger("rhumbatron.kafka")


def admin_client(base: Mapping[str, Any]) -> AdminClient:
    return AdminClient(client_config(base))


def ensure_reachable(admin: AdminClient, base: Mapping[str, Any], timeout: float) -> Any:
    """Return cluster metadata, or raise Unreachable naming the address within ``timeout``; a
    broker that refused the login or the TLS handshake raises KafkaLoginRefused instead, naming
    the listener, the protocol, the mechanism and the user (never the password)."""
    try:
        return admin.list_topics(timeout=timeout)
    except KafkaException as exc:
        refusal = _login_refusal(base, timeout)
        if refusal is not None:
            raise refusal from exc
        raise Unreachable(
            "Kafka", bootstrap_of(base), f"no metadata answer within {timeout:g}s ({exc.args[0]})"
        ) from exc


# How long the diagnosis of a failed metadata request waits for librdkafka's reason: a refused
# login or handshake is reported within a round trip or two of connecting.
_LOGIN_PROBE_S = 3.0
# librdkafka's reason starts with the broker's name and ends with its connection state.
_BROKER_PREFIX = re.compile(r"^\S+://\S+?: ")
_STATE_SUFFIX = re.compile(r" \(after \d+ms in state \w+\)$")


def _login_refusal(base: Mapping[str, Any], timeout: float) -> KafkaLoginRefused | None:
    """Why a secured client got no metadata, if the broker refused its login or the handshake.
    librdkafka tells only its error callback (a metadata request merely times out), so a probe
    client with one asks again, briefly. None: no login was refused (or none is configured)."""
    if str(base.get("security.protocol", "PLAINTEXT")).upper() == "PLAINTEXT":
        return None
    seen: list[KafkaError] = []
    probe = AdminClient(client_config(base, extra={"error_cb": seen.append}))
    deadline = time.monotonic() + min(timeout, _LOGIN_PROBE_S)
    while time.monotonic() < deadline:
        try:
            probe.list_topics(timeout=0.3)
            return None  # it answered this time
        except KafkaException:
            pass
        probe.poll(0)  # serves the error callback
        for error in seen:
            if error.code() in (KafkaError._AUTHENTICATION, KafkaError._SSL):
                reason = _STATE_SUFFIX.sub("", _BROKER_PREFIX.sub("", error.str()))
                return KafkaLoginRefused(
                    listener_of(base), reason, tls=error.code() == KafkaError._SSL
                )
    return None


@dataclass
class ProvisionReport:
    created: list[str] = field(default_factory=list)
    existing: list[str] = field(default_factory=list)
    reconfigured: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def summary(self) -> str:
        return (
            f"{len(self.created)} created, {len(self.existing)} already present, "
            f"{len(self.reconfigured)} reconfigured"
        )


def _result(future: Any, what: str, base: Mapping[str, Any], timeout: float) -> Any:
    try:
        return future.result(timeout=timeout)
    except KafkaException as exc:
        error: KafkaError = exc.args[0]
        if error.code() in (KafkaError._TRANSPORT, KafkaError._TIMED_OUT):
            raise Unreachable("Kafka", bootstrap_of(base), f"{what}: {error.str()}") from exc
        raise
    except TimeoutError as exc:
        raise Unreachable(
            "Kafka", bootstrap_of(base), f"{what}: no answer in {timeout:g}s"
        ) from exc


def provision(
    admin: AdminClient,
    base: Mapping[str, Any],
    specs: Iterable[TopicSpec],
    *,
    topology: Topology,
    timeout: float,
) -> ProvisionReport:
    """Create what is missing and align retention of what exists. Running it twice is a no-op.

    Refuses, before creating anything, a plan that would leave the environment with more streams
    than ``topology.max_streams``. Never changes an existing topic's partition count: that would
    move projects between partitions and break their order.
    """
    specs = list(specs)
    metadata = ensure_reachable(admin, base, timeout)
    existing = metadata.topics
    planned_streams = {s.name for s in specs if s.kind == "stream"}
    total = topology.count_streams(set(existing) | planned_streams)
    if total > topology.max_streams:
        raise TopologyError(
            f"the plan would leave {total} streams in environment '{topology.env}', over the "
            f"limit of {topology.max_streams} (max_streams_per_env); nothing was created"
        )
    report = ProvisionReport()
    missing = [s for s in specs if s.name not in existing]
    report.created = _create_missing(admin, base, missing, timeout)
    report.existing.extend(s.name for s in missing if s.name not in report.created)
    present = [s for s in specs if s.name in existing]
    for spec in present:
        report.existing.append(spec.name)
        have = len(existing[spec.name].partitions)
        if have != spec.partitions:
            report.warnings.append(
                f"{spec.name} has {have} partitions, the plan says {spec.partitions}; left as is "
                "(changing it would move projects between partitions)"
            )
    report.reconfigured = _align_configs(admin, base, present, timeout)
    return report


def ensure_topics(
    admin: AdminClient, base: Mapping[str, Any], specs: Iterable[TopicSpec], *, timeout: float
) -> list[str]:
    """Create those of ``specs`` that do not exist, and return (the names created) once every
    partition of every one of them is served. Changes nothing that exists, neither partitions nor
    configuration: for a client that owns its topics but may not alter them (the analytics
    rollup, whose consumer must find them in the broker's metadata when it joins its group)."""
    specs = list(specs)
    metadata = ensure_reachable(admin, base, timeout)
    present = [s.name for s in specs if s.name in metadata.topics]
    created = _create_missing(admin, base, [s for s in specs if s.name not in present], timeout)
    if present:  # maybe created a moment ago by another client; what was missing is awaited
        _await_leaders(admin, base, present, timeout)
    return created


def _create_missing(
    admin: AdminClient, base: Mapping[str, Any], missing: list[TopicSpec], timeout: float
) -> list[str]:
    """Create ``missing`` and wait until they are served; the names this call created (a topic
    another client created meanwhile is not among them)."""
    if not missing:
        return []
    futures = admin.create_topics(
        [NewTopic(s.name, s.partitions, s.replication_factor, config=s.config) for s in missing],
        operation_timeout=timeout,
        request_timeout=timeout,
    )
    created = []
    for name, future in futures.items():
        try:
            _result(future, f"creating {name}", base, timeout)
            created.append(name)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise TopologyError(f"could not create topic {name}: {exc.args[0].str()}") from exc
    _await_leaders(admin, base, [s.name for s in missing], timeout)
    return created


def _await_leaders(
    admin: AdminClient, base: Mapping[str, Any], topics: list[str], timeout: float
) -> None:
    """Return once every partition of ``topics`` has a leader in the broker's metadata and that
    leader serves it: a topic is usable only then (a producer that races ahead gets
    UNKNOWN_TOPIC_OR_PART)."""

    def not_served() -> str | None:
        metadata = ensure_reachable(admin, base, timeout)
        waiting = {
            t
            for t in topics
            if t not in metadata.topics
            or metadata.topics[t].error is not None
            or any(p.leader < 0 for p in metadata.topics[t].partitions.values())
        } or _not_serving(admin, metadata, topics, timeout)
        return f"topics {sorted(waiting)} were created but are not served" if waiting else None

    _wait_until(not_served, base, timeout)


def _wait_until(pending: Callable[[], str | None], base: Mapping[str, Any], timeout: float) -> None:
    """Ask ``pending`` until it answers None (done); raise Unreachable with its last answer (what
    is still pending) once ``timeout`` has passed."""
    deadline = time.monotonic() + timeout
    while (what := pending()) is not None:
        if time.monotonic() > deadline:
            raise Unreachable("Kafka", bootstrap_of(base), f"{what} after {timeout:g}s")
        time.sleep(0.05)


def _not_serving(admin: AdminClient, metadata: Any, topics: list[str], timeout: float) -> set[str]:
    """Topics some partition of which the leader does not serve yet: a ListOffsets request goes
    to the partition's log itself, which a broker creates after it announced the leader (a
    produce in between is refused with UNKNOWN_TOPIC_OR_PART)."""
    request = {
        TopicPartition(t, p): OffsetSpec.latest()
        for t in topics
        for p in metadata.topics[t].partitions
    }
    if not request:
        return set()
    failing: set[str] = set()
    for tp, future in admin.list_offsets(request, request_timeout=timeout).items():
        try:
            future.result()
        except KafkaException:
            failing.add(tp.topic)
    return failing


def _align_configs(
    admin: AdminClient, base: Mapping[str, Any], specs: list[TopicSpec], timeout: float
) -> list[str]:
    if not specs:
        return []
    current = describe_configs(admin, base, [s.name for s in specs], timeout)
    changed: list[str] = []
    resources = []
    for spec in specs:
        drift = {k: v for k, v in spec.config.items() if current.get(spec.name, {}).get(k) != v}
        if drift:
            resource = ConfigResource(
                ConfigResource.Type.TOPIC,
                spec.name,
                incremental_configs=[
                    ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET)
                    for k, v in drift.items()
                ],
            )
            resources.append(resource)
            changed.append(spec.name)
    if resources:
        for future in admin.incremental_alter_configs(resources, request_timeout=timeout).values():
            _result(future, "altering topic configs", base, timeout)
        # The broker applies a config change to its metadata asynchronously: return once it shows,
        # so whoever provisions next (or describes the topology) sees what was set.
        wanted = {s.name: s.config for s in specs if s.name in changed}

        def not_applied() -> str | None:
            now = describe_configs(admin, base, list(wanted), timeout)
            done = all(
                now.get(t, {}).get(k) == v for t, cfg in wanted.items() for k, v in cfg.items()
            )
            return None if done else f"config changes of {sorted(wanted)} not applied"

        _wait_until(not_applied, base, timeout)
    return changed


def describe_configs(
    admin: AdminClient, base: Mapping[str, Any], topics: list[str], timeout: float
) -> dict[str, dict[str, str]]:
    if not topics:
        return {}
    resources = [ConfigResource(ConfigResource.Type.TOPIC, t) for t in topics]
    out: dict[str, dict[str, str]] = {}
    for resource, future in admin.describe_configs(resources, request_timeout=timeout).items():
        entries = _result(future, f"describing {resource.name}", base, timeout)
        out[resource.name] = {k: e.value for k, e in entries.items()}
    return out


def describe_topology(
    admin: AdminClient, base: Mapping[str, Any], topology: Topology, timeout: float
) -> dict[str, list[dict[str, Any]]]:
    """What exists on the broker for this environment, grouped as the plan groups it."""
    metadata = ensure_reachable(admin, base, timeout)
    groups = {
        "streams": topology.stream_specs(),
        "queues": topology.queue_specs(),
        "internal": topology.internal_specs(),
    }
    names = [s.name for specs in groups.values() for s in specs if s.name in metadata.topics]
    configs = describe_configs(admin, base, names, timeout)
    out: dict[str, list[dict[str, Any]]] = {}
    for group, specs in groups.items():
        out[group] = [
            {
                "name": s.name,
                "partitions": len(metadata.topics[s.name].partitions),
                "retention_ms": int(configs[s.name]["retention.ms"]),
            }
            for s in specs
            if s.name in metadata.topics
        ]
    return out


def delete_topics(
    admin: AdminClient, base: Mapping[str, Any], topics: list[str], timeout: float
) -> None:
    if not topics:
        return
    for name, future in admin.delete_topics(topics, operation_timeout=timeout).items():
        try:
            _result(future, f"deleting {name}", base, timeout)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                raise
