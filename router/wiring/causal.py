"""Wiring the causal router from settings: its classifier, caps, outbox, and the companion threads
that live and die with its consume process.

The router's consume process (``rhumbatron consume --subscription causal-router``) runs two
threads besides the consume loop — the subscription's *companion*, started by ``consume`` once
the processor is built and stopped when the loop ends:

- the **publisher** of the router's outbox (``router_outbox_path``, by default the environment's
  outbox ``<state_dir>/outbox-{env}.sqlite``, or the writers' PostgreSQL outbox by its URL): it
  sends the events the router decided (``candidate.stale``) to the streams. Router processes
  share the outbox; its publisher lease lets one of them publish at a time (a kernel lock, or
  PostgreSQL's advisory lock, freed however its holder dies) and the others try again every
  ``outbox_poll_interval_s``, so a row left by a crashed process is published by whichever
  process holds the lease next. With ``router_publish_outbox`` off there is no such thread: a
  ``rhumbatron publish`` of the same outbox (the fleet's publisher member) sends the rows;
- the **maintenance tick** (``maintenance_at_utc``, checked every ``maintenance_check_interval_s``;
  one process a day does it, see :mod:`consumers.subscriptions.causal_router.maintenance`).

A normal exit of ``consume`` (SIGTERM, SIGINT, ``--until-idle``) closes the publisher cleanly; a
SIGKILL ends the threads with the process, which the outbox and the tick are built to survive
(rows re-sent, ids stable). Commands that only build the processor (operator controls) start no
threads.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import TypeGuard

import redis

from consumers.runtime.types import JSON, TP, Processor
from consumers.subscriptions.causal_router.budget import RedisCommandBudget, RedisDailyCounter
from consumers.subscriptions.causal_router.classifier import (
    Classifier,
    HeuristicClassifier,
    HttpClassifier,
    OverlapJudge,
)
from consumers.subscriptions.causal_router.commands import queue_of
from consumers.subscriptions.causal_router.fold import FoldLimits
from consumers.subscriptions.causal_router.maintenance import MaintenanceTick
from consumers.subscriptions.causal_router.processor import SLUG, CausalRouter, RouterConfig
from router.settings import Settings
from router.wiring.outbox import build_publisher, open_outbox
from router.wiring.subscription import store as runtime_store
from streams.clock import Clock
from streams.envelopes import Command
from streams.errors import PublisherLocked
from streams.files import private_dir
from streams.outbox.sqlite import SqliteOutbox
from streams.outbox.standby import PublisherRole
from streams.outbox.store import OutboxStore, is_postgres_url
from streams.producer import Producer

log = logging.getLogger("rhumbatron.causal_router")


def router_config(settings: Settings) -> RouterConfig:
    return RouterConfig(
        env=settings.env,
        max_envelope_bytes=settings.max_envelope_bytes,
        command_ttl_s=settings.command_ttl_s,
        commands_per_change_per_day=settings.commands_per_change_per_day,
        limits=FoldLimits(
            agents_per_change=settings.agents_per_change,
            history=settings.router_fold_history,
            max_resources=settings.router_max_resources_per_event,
        ),
    )


def classifier(settings: Settings) -> Classifier:
    """The model endpoint when ``classifier_url`` is set, else the local heuristic."""
    if settings.classifier_url:
        return HttpClassifier(
            settings.classifier_url,
            key=settings.classifier_key,
            timeout_s=settings.classifier_timeout_s,
            max_answer_bytes=settings.classifier_max_answer_bytes,
        )
    return HeuristicClassifier()


def router_outbox_path(settings: Settings) -> Path | str:
    """One outbox per environment (its rows carry no environment; the publisher sends each to the
    stream of its project in the publishing process's environment). By default it is the
    environment's outbox the services write to as well: slots are allocated per outbox, and a
    project's log must be one dense sequence, so the router's events take their slots from the
    same counter as every other event of the project. When the writers' outbox is on PostgreSQL,
    ``router_outbox_path`` is its ``postgresql://`` URL (returned as given, ``{env}`` replaced):
    the router writes to the writers' own tables."""
    address = settings.router_outbox_path
    if is_postgres_url(address):
        return address.replace("{env}", settings.env)
    return settings.in_state_dir(address)


def open_router_outbox(settings: Settings, clock: Clock | None = None) -> OutboxStore:
    """The router's outbox: a SQLite file made on first use in a private folder, or the writers'
    PostgreSQL outbox (its schema made beforehand by ``rhumbatron outbox init``)."""
    address = router_outbox_path(settings)
    if isinstance(address, str):
        return open_outbox(settings, address, create=False, clock=clock)
    private_dir(address.parent)
    return open_outbox(settings, address, create=True, clock=clock)


def build_router(
    settings: Settings, client: redis.Redis[bytes], clock: Clock, *, outbox: OutboxStore
) -> CausalRouter:
    """The processor alone, with Redis-backed caps (no threads)."""
    return CausalRouter(
        router_config(settings),
        judge=OverlapJudge(
            classifier(settings),
            RedisDailyCounter(client, env=settings.env, ttl_s=settings.router_counter_ttl_s),
            settings.classifier_calls_per_day,
            settings.classifier_threshold,
            clock.now,
        ),
        budget=RedisCommandBudget(
            client,
            env=settings.env,
            cap=settings.commands_per_change_per_day,
            ttl_s=settings.router_counter_ttl_s,
        ),
        outbox=outbox,
        clock=clock,
    )


def build(settings: Settings, client: redis.Redis[bytes], clock: Clock) -> CausalRouter:
    """The causal router's processor (``router.wiring.processors.causal_router`` builds it)."""
    return build_router(settings, client, clock, outbox=open_router_outbox(settings))


def companion(
    settings: Settings, client: redis.Redis[bytes], clock: Clock, processor: Processor
) -> RouterCompanion:
    """The causal router's companion (``router.wiring.processors.causal_router`` registers it):
    the publisher of the processor's outbox and the maintenance tick."""
    if not isinstance(processor, CausalRouter) or not _outbox_store(processor.outbox):
        raise TypeError(f"the causal router's companion needs its outbox store, got {processor!r}")
    return RouterCompanion(settings, client, clock, processor.outbox)


def _outbox_store(outbox: object) -> TypeGuard[OutboxStore]:
    if isinstance(outbox, SqliteOutbox):
        return True
    # Only a router whose outbox is PostgreSQL's imports the driver.
    from streams.outbox.postgres import PostgresOutbox

    return isinstance(outbox, PostgresOutbox)


def read_states(settings: Settings, client: redis.Redis[bytes], clock: Clock) -> dict[str, JSON]:
    """Every project's router fold, from the runtime's store (all streams and partitions)."""
    store = runtime_store(settings, client, SLUG, clock)
    states: dict[str, JSON] = {}
    for topic in settings.topology.stream_names():
        for partition in range(settings.partitions):
            states.update(store.all_states(TP(topic, partition)))
    return states


def maintenance_tick(
    settings: Settings, client: redis.Redis[bytes], clock: Clock, producer: Producer
) -> MaintenanceTick:
    def send(commands: list[Command]) -> None:
        for command in commands:
            producer.produce_command(
                queue_of(command, settings.env), command, max_bytes=settings.max_envelope_bytes
            )
        producer.flush(settings.flush_timeout_s)

    def states() -> Mapping[str, JSON]:
        return read_states(settings, client, clock)

    return MaintenanceTick(
        client,
        env=settings.env,
        at_utc=settings.maintenance_at_utc,
        cap=settings.maintenance_commands_per_tick,
        ttl_s=settings.command_ttl_s,
        lock_ttl_s=settings.maintenance_lock_ttl_s,
        read_states=states,
        send=send,
        clock=clock,
    )


class RouterCompanion:
    """The router process's publisher and maintenance threads."""

    def __init__(
        self, settings: Settings, client: redis.Redis[bytes], clock: Clock, outbox: OutboxStore
    ) -> None:
        self.settings = settings
        self.client = client
        self.clock = clock
        self.outbox = outbox
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []
        self.publishing = threading.Event()  # set while this process holds the publisher lease
        self._producer: Producer | None = None

    def start(self) -> None:
        targets = []
        if self.settings.router_publish_outbox:
            targets.append(("publisher", self._publish))
        if self.settings.maintenance_enabled:
            targets.append(("maintenance", self._maintain))
        for name, target in targets:
            thread = threading.Thread(target=target, name=f"{SLUG}-{name}", daemon=True)
            thread.start()
            self.threads.append(thread)

    def close(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(self.settings.connect_timeout_s)
        self.threads = []
        if self._producer is not None:
            self._producer.close(self.settings.connect_timeout_s)
            self._producer = None

    def _publish(self) -> None:
        settings = self.settings
        with PublisherRole(self.outbox.location) as role:
            while not self.stop.is_set():
                try:
                    publisher = build_publisher(settings, self.outbox)
                except PublisherLocked as exc:
                    role.standby()
                    log.debug("%s; trying again in %gs", exc, settings.outbox_poll_interval_s)
                    self.stop.wait(settings.outbox_poll_interval_s)
                    continue
                self.publishing.set()
                role.active()
                try:
                    publisher.run(stop=self.stop)
                except PublisherLocked as exc:
                    role.standby()
                    log.warning("%s: lost the outbox's publisher lease (%s)", SLUG, exc.held_by)
                except Exception:
                    log.exception("%s: the outbox publisher failed; restarting it", SLUG)
                    self.stop.wait(settings.outbox_backoff_initial_s)
                finally:
                    self.publishing.clear()
                    publisher.close()

    def _maintain(self) -> None:
        self._producer = Producer(self.settings.kafka_config())
        tick = maintenance_tick(self.settings, self.client, self.clock, self._producer)
        while not self.stop.is_set():
            try:
                tick.run_if_due()
            except Exception:
                log.exception("%s: the maintenance tick failed; it will be tried again", SLUG)
            self.stop.wait(self.settings.maintenance_check_interval_s)
