"""Injecting the faults of the command side's rows and the dead-letter store's, and knowing that
each struck (tests/chaos/matrix/faults.py's ``Injector`` hands these rows to them):

- ``RouterPoison``: one ``intent.declared`` the ledger and the causal router both fail on;
- ``DeadLetterOutage``: the dead-letter topic refuses every record until the ledger has failed
  to write its letter a few times, then takes them again;
- ``TransactionalZombie``: a transactional producer frozen before its commit, replaced by a
  process with its transactional id, then resumed.
"""

from __future__ import annotations

import dataclasses
import signal
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import cast

from confluent_kafka import Message
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

from consumers.subscriptions.ledger import read_ledger
from consumers.topic_reader import read_committed
from router.settings import Settings
from router.wiring.subscription import dead_letters, redis_client
from streams.admin import admin_client
from streams.envelopes import Draft
from streams.headers import DEAD_LETTER_ID
from streams.topology import dead_letter_topic
from streams.workload import slotted_events
from tests.chaos.matrix.pipeline import Pipeline
from tests.chaos.matrix.scenarios import (
    LEDGER,
    ROUTER,
    AtEvent,
    DeadLetterOutage,
    RouterPoison,
    Scenario,
    TransactionalZombie,
)
from tests.support.causal_router import drive, make_router, open_test_outbox

# The ledger fails, every time, an event whose payload says so; the router's fold refuses an
# intent whose resources are not a list of paths (consumers/subscriptions/causal_router/payload.py).
# Valid for the catalog (the outbox and the publisher check payloads), refused by the router's
# fold: an intent naming no path at all.
ROUTER_POISON: dict[str, object] = {"drill": "fail", "resources": []}
# Smaller than any record batch: the broker refuses every write to the topic (MESSAGE_TOO_LARGE).
REFUSING_BYTES = "1"
WRITE_FAILED = "dead-letter write failed"
# What the runtime and the worker log when a transaction of theirs was refused and aborted.
REFUSED = ("transaction failed, will re-send", "record(s) failed (")


def _decides(drafts: Sequence[Draft], event_id: str) -> bool:
    """Whether the rules decide a command on this event of its project's drafts."""
    project = next(d.project_id for d in drafts if d.event_id == event_id)
    events = slotted_events([d for d in drafts if d.project_id == project], tenant_id="t")
    with tempfile.TemporaryDirectory() as tmp:
        router = make_router(open_test_outbox(Path(tmp) / "outbox.sqlite"))
        return any(c.payload.get("causedBy") == event_id for c in drive(router, events))


def router_poisoned(scenario: Scenario, drafts: Sequence[Draft]) -> tuple[list[Draft], list[str]]:
    """The workload with its first ``intent.declared`` from ``AtEvent`` on that the rules
    answer with a command (an agent woken: so the commands without it differ) made a poison for
    the ledger and the router, and its id."""
    assert isinstance(scenario.when, AtEvent), f"{scenario.name}: a poison event sits AtEvent"
    out = list(drafts)
    start = int(len(out) * scenario.when.fraction)
    at = next(
        n
        for n in range(start, len(out))
        if out[n].event_type == "intent.declared" and _decides(out, out[n].event_id)
    )
    out[at] = dataclasses.replace(out[at], payload={**out[at].payload, **ROUTER_POISON})
    return out, [out[at].event_id]


def _dead_letter_limit(s: Settings, value: str | None) -> None:
    """The dead-letter topic's ``max.message.bytes`` set to ``value``, or back to the broker's
    default (None); waits until the broker shows it, so the outage starts (or ends) now."""
    base = s.kafka_config()
    admin = admin_client(base)
    topic = dead_letter_topic(s.env)
    op = AlterConfigOpType.SET if value is not None else AlterConfigOpType.DELETE
    resource = ConfigResource(
        ConfigResource.Type.TOPIC,
        topic,
        incremental_configs=[
            ConfigEntry("max.message.bytes", value or "", incremental_operation=op)
        ],
    )
    for future in admin.incremental_alter_configs([resource], request_timeout=10).values():
        future.result()
    deadline = time.monotonic() + 30  # topic configs reach the broker's cache asynchronously
    while True:
        [future] = admin.describe_configs(
            [ConfigResource(ConfigResource.Type.TOPIC, topic)], request_timeout=10
        ).values()
        shown = future.result()["max.message.bytes"].value
        if (shown == value) if value is not None else (shown != REFUSING_BYTES):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"{topic}: max.message.bytes still {shown}, not {value}")
        time.sleep(0.1)


def _ledger_log(logs: Path) -> str:
    return "".join(p.read_text(errors="replace") for p in sorted(logs.glob(f"{LEDGER}*.log")))


class OutageInjector:
    """``DeadLetterOutage``: the store refuses from the first poll until the ledger has logged
    ``failed_writes`` failed dead-letter writes. At the healing it records what the pipeline
    had done meanwhile: no letter in the index, and nothing of the poison's project applied
    past it."""

    def __init__(
        self, fault: DeadLetterOutage, s: Settings, logs: Path, poison: Draft, slot: int
    ) -> None:
        self.fault = fault
        self.s = s
        self.logs = logs
        self.poison = poison
        self.slot = slot
        self.struck_at: float | None = None
        self.healed_at: float | None = None
        self.found: list[str] = []

    def poll(self) -> None:
        if self.struck_at is None:
            _dead_letter_limit(self.s, REFUSING_BYTES)
            self.struck_at = time.monotonic()
        elif (
            self.healed_at is None
            and _ledger_log(self.logs).count(WRITE_FAILED) >= self.fault.failed_writes
        ):
            self._while_down()
            _dead_letter_limit(self.s, None)
            self.healed_at = time.monotonic()

    def _while_down(self) -> None:
        client = redis_client(self.s)
        written = dead_letters(self.s, client).list()
        if written:
            self.found.append(
                f"letters in the index while the store refused: {[d.id for d in written]}"
            )
        applied = read_ledger(client, self.s.env)["projects"].get(self.poison.project_id, [])
        beyond = [n for n in applied if n >= self.slot]
        if beyond:
            self.found.append(
                f"project {self.poison.project_id} applied slots {beyond} past its poison "
                f"(slot {self.slot}) before its letter was written"
            )

    def problems(self) -> list[str]:
        if self.struck_at is None:
            return ["the dead-letter store never refused"]
        if self.healed_at is None:
            return [f"the ledger never logged {self.fault.failed_writes} failed letter writes"]
        # Once the store wrote again, each letter's records went to the topic once: the refused
        # writes left nothing there, and the letter was not written again after it landed.
        written: Counter[str] = Counter()

        def visit(message: Message) -> None:
            headers = dict(cast(list[tuple[str, bytes]], message.headers() or []))
            written[headers.get(DEAD_LETTER_ID, b"?").decode()] += 1

        read_committed(
            self.s.kafka_config(),
            [dead_letter_topic(self.s.env)],
            visit,
            timeout_s=self.s.flush_timeout_s + 10,
        )
        letters = dead_letters(self.s, redis_client(self.s)).list()
        want = {d.id: len(d.entries) for d in letters}
        if dict(written) != want:
            return [*self.found, f"dead-letter topic holds {dict(written)}, not {want}"]
        return self.found


class ZombieInjector:
    """``TransactionalZombie``: struck once the member froze itself; the replacement started
    ``takeover_after_s`` later; resumed ``frozen_s`` after the freeze."""

    def __init__(
        self,
        fault: TransactionalZombie,
        pipeline: Pipeline,
        stopped: Callable[[int], bool],
        snapshot: Callable[[], dict[str, int]],
    ) -> None:
        self.fault = fault
        self.pipeline = pipeline
        self.stopped = stopped
        self.snapshot = snapshot
        self.struck_at: float | None = None
        self.healed_at: float | None = None
        self.at_strike: dict[str, int] = {}
        self.replaced_at: float | None = None

    @property
    def takeover(self) -> str:
        return f"{self.fault.role}-takeover"

    def poll(self) -> None:
        member = self.pipeline.members[self.fault.role]
        now = time.monotonic()
        if self.struck_at is None:
            if member.proc is not None and not member.exits and self.stopped(member.proc.pid):
                self.struck_at = now
                self.at_strike = self.snapshot()
        elif self.replaced_at is None:
            if now - self.struck_at >= self.fault.takeover_after_s:
                self.pipeline.add(self.takeover, self.fault.role)
                self.replaced_at = now
        elif self.healed_at is None and now - self.struck_at >= self.fault.frozen_s:
            member.signal(signal.SIGCONT)
            self.healed_at = now

    def problems(self) -> list[str]:
        if self.struck_at is None:
            return [f"{self.fault.role} never froze at {self.fault.point}"]
        if self.healed_at is None:
            return [f"{self.fault.role} was never resumed"]
        zombie = self.pipeline.members[self.fault.role].log(0).read_text(errors="replace")
        if not any(refused in zombie for refused in REFUSED):
            return [f"{self.fault.role}: the resumed zombie's log shows no transaction refused"]
        return []


def poison_at(drafts: Sequence[Draft], event_id: str) -> tuple[Draft, int]:
    """The poison's draft and its slot (its place in its project's events, from 1)."""
    poison = next(d for d in drafts if d.event_id == event_id)
    own = [d.event_id for d in drafts if d.project_id == poison.project_id]
    return poison, own.index(event_id) + 1


def poisoned_for(scenario: Scenario, poison: Sequence[str]) -> dict[str, list[str]]:
    """Which subscription dead-letters which of the row's poison events."""
    if isinstance(scenario.fault, RouterPoison):
        return {LEDGER: list(poison), ROUTER: list(poison)}
    return {LEDGER: list(poison)} if poison else {}
