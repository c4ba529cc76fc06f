"""Injecting a row's fault, and knowing that it struck: a row whose fault never fired proves
nothing, so it fails (``Injector.problems``)."""

from __future__ import annotations

import dataclasses
import signal
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

from router.settings import Settings
from streams.envelopes import Draft
from streams.failpoints import ENV as FAILPOINTS
from streams.outbox.publisher import AFTER_ACK
from streams.topology import stream_index
from tests.chaos.matrix import command_faults
from tests.chaos.matrix.moves import Operator
from tests.chaos.matrix.pipeline import Pipeline
from tests.chaos.matrix.scenarios import (
    PUBLISHER,
    AfterApplied,
    AtEvent,
    AtPass,
    Churn,
    DeadLetterOutage,
    FailingCommands,
    Failpoint,
    Freeze,
    Garbage,
    LongOutage,
    OperatorMoves,
    OutboxServerKill,
    Poison,
    RouterPoison,
    Scenario,
    ServerKill,
    TransactionalZombie,
)
from tests.support import hostile
from tests.support.infra import PrivateServices

# The ledger fails, every time, an event whose payload says so (consumers/subscriptions/ledger.py).
DRILL = {"drill": "fail"}
# A churning member waiting for its first assignment (Churn.after_assigned) leaves past this.
ASSIGNMENT_BOUND_S = 60.0


def armed(scenario: Scenario) -> dict[str, dict[str, str]]:
    """The extra environment of each member's first start."""
    fault, when = scenario.fault, scenario.when
    if isinstance(fault, Failpoint | Freeze):
        assert isinstance(when, AtPass), f"{scenario.name}: a fail-point strikes AtPass"
        mode = ":stop" if isinstance(fault, Freeze) else ""
        return {fault.role: {FAILPOINTS: f"{fault.point}@{when.nth}{mode}"}}
    if isinstance(fault, TransactionalZombie):
        assert isinstance(when, AtPass), f"{scenario.name}: a fail-point strikes AtPass"
        return {fault.role: {FAILPOINTS: f"{fault.point}@{when.nth}:stop"}}
    if isinstance(fault, OutboxServerKill):
        assert isinstance(when, AtPass), f"{scenario.name}: a kill mid-publish strikes AtPass"
        return {PUBLISHER: {FAILPOINTS: f"{AFTER_ACK}@{when.nth}:stop"}}
    return {}


def stopped(pid: int) -> bool:
    """The process is stopped (SIGSTOP): state ``T`` in /proc."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] == "T"


def poisoned(scenario: Scenario, drafts: Sequence[Draft]) -> tuple[list[Draft], list[str]]:
    """The workload with the row's poison event marked, and the ids it marked."""
    if isinstance(scenario.fault, RouterPoison):
        return command_faults.router_poisoned(scenario, drafts)
    if isinstance(scenario.fault, OperatorMoves):  # its drill event, for the skip-through
        fraction = scenario.fault.poison_at
    elif isinstance(scenario.fault, Poison | DeadLetterOutage):
        assert isinstance(scenario.when, AtEvent), f"{scenario.name}: a poison event sits AtEvent"
        fraction = scenario.when.fraction
    else:
        return list(drafts), []
    out = list(drafts)
    at = int(len(out) * fraction)
    stream = scenario.fault.stream if isinstance(scenario.fault, Poison) else None
    if stream is not None:
        streams = Settings.model_fields["streams"].default
        at = next(
            i for i in range(at, len(out)) if stream_index(out[i].project_id, streams) == stream
        )
    out[at] = dataclasses.replace(out[at], payload={**out[at].payload, **DRILL})
    return out, [out[at].event_id]


class Drill(Protocol):
    """A fault driven from its own module (publisher_faults.py): it strikes and heals from
    :meth:`poll`, and says what went wrong with it."""

    struck_at: float | None
    healed_at: float | None
    at_strike: dict[str, int]

    def poll(self) -> None: ...

    def problems(self) -> list[str]: ...


class Injector:
    """Fires a server fault when its moment comes, heals it, and says whether each fault struck."""

    def __init__(
        self,
        scenario: Scenario,
        pipeline: Pipeline,
        services: PrivateServices | None,
        applied: Callable[[], int],
        expected: int,
        snapshot: Callable[[], dict[str, int]],
        total: int,
        drill: Drill | None = None,
        *,
        settings: Settings | None = None,
        logs: Path | None = None,
        drafts: Sequence[Draft] = (),
        poison: Sequence[str] = (),
    ) -> None:
        self.scenario = scenario
        self.drill = drill
        self.pipeline = pipeline
        self.services = services
        self.applied = applied
        self.expected = expected
        self.snapshot = snapshot
        self.total = total  # events the workload writes to the outbox
        self.at_strike: dict[str, int] = {}  # how far the pipeline was when the fault struck
        self.struck_at: float | None = None  # monotonic
        self.healed_at: float | None = None
        self._healer: threading.Thread | None = None
        self._heal_error: BaseException | None = None
        self._churned = 0  # joins so far
        self._joined_at = 0.0
        # The faults of tests/chaos/matrix/command_faults.py, which inject and heal themselves.
        self._extra: command_faults.OutageInjector | command_faults.ZombieInjector | None = None
        fault = scenario.fault
        if isinstance(fault, DeadLetterOutage):
            assert settings is not None and logs is not None and poison
            self._extra = command_faults.OutageInjector(
                fault, settings, logs, *command_faults.poison_at(drafts, poison[0])
            )
        elif isinstance(fault, TransactionalZombie):
            self._extra = command_faults.ZombieInjector(fault, pipeline, stopped, snapshot)
        self._assigned_at = 0.0  # when the latest join first held partitions (after_assigned)
        self.settings = settings
        # Garbage: each hostile record written, by where it landed (topic, partition, offset).
        self.garbage: dict[tuple[str, int, int], hostile.Hostile] = {}
        self.operator: Operator | None = None  # OperatorMoves: the moves under way

    @property
    def healing(self) -> bool:
        """Struck and not yet healed: the pipeline cannot be drained yet."""
        if self._heal_error is not None:
            return False
        return self.struck_at is not None and self.healed_at is None

    def poll(self) -> None:
        fault, when = self.scenario.fault, self.scenario.when
        if self.drill is not None:
            self.drill.poll()
            self.struck_at, self.healed_at = self.drill.struck_at, self.drill.healed_at
            self.at_strike = self.drill.at_strike
        elif self._extra is not None:
            self._extra.poll()
            self.struck_at, self.healed_at = self._extra.struck_at, self._extra.healed_at
            if isinstance(self._extra, command_faults.ZombieInjector):
                self.at_strike = self._extra.at_strike
        elif isinstance(fault, FailingCommands) and self.struck_at is None:
            # Nothing to inject: the workers' handlers fail commands by the row's rule (the
            # command side's checks say whether any did).
            self.struck_at = self.healed_at = time.monotonic()
        elif isinstance(fault, Failpoint):
            first = self.pipeline.members[fault.role].exits[:1]
            if first == [-signal.SIGKILL] and self.struck_at is None:
                self.struck_at = self.healed_at = time.monotonic()
                self.at_strike = self.snapshot()
        elif isinstance(fault, Freeze):
            self._freeze(fault)
        elif isinstance(fault, ServerKill | LongOutage) and self.struck_at is None:
            if self._due(when):
                self._kill(fault)
        elif isinstance(fault, OutboxServerKill) and self.struck_at is None:
            publisher = self.pipeline.members[PUBLISHER]
            if publisher.proc is not None and not publisher.exits and stopped(publisher.proc.pid):
                self._kill(fault)
                publisher.signal(signal.SIGCONT)
        elif isinstance(fault, Garbage) and self.struck_at is None:
            if self._due(when):
                self._garbage(fault)
        elif isinstance(fault, OperatorMoves):
            self._moves()
        elif (
            isinstance(fault, Churn)
            and self.healed_at is None
            and (self.struck_at is not None or self._due(when))
        ):
            self._churn(fault)

    def _due(self, when: object) -> bool:
        assert isinstance(when, AfterApplied), f"{self.scenario.name}: a strike AfterApplied"
        try:
            return self.applied() >= self.expected * when.fraction
        except Exception:  # a busy server is asked again on the next poll
            return False

    def _freeze(self, fault: Freeze) -> None:
        member = self.pipeline.members[fault.role]
        now = time.monotonic()
        if self.struck_at is None:
            if member.proc is not None and not member.exits and stopped(member.proc.pid):
                self.struck_at = now
                self.at_strike = self.snapshot()
                # The group moves on without it once its session expires.
                self.pipeline.add(f"{fault.role}-takeover", fault.role)
        elif self.healed_at is None and now - self.struck_at >= fault.frozen_s:
            member.signal(signal.SIGCONT)
            self.healed_at = now

    def _churn(self, fault: Churn) -> None:
        now = time.monotonic()
        name = f"{fault.role}-churn{self._churned}"
        if self.struck_at is None:
            self.struck_at = now
            self.at_strike = self.snapshot()
        if self._churned and f"{fault.role}-churn{self._churned - 1}" in self.pipeline.members:
            joined = self.pipeline.members[f"{fault.role}-churn{self._churned - 1}"]
            if fault.after_assigned and not self._assigned_at:
                # Given up on past the bound: problems() names the join that got nothing.
                held = "assigned" in joined.log(0).read_text(errors="replace")
                if held or now - self._joined_at >= ASSIGNMENT_BOUND_S:
                    self._assigned_at = now
                return
            if now - max(self._joined_at, self._assigned_at) >= fault.every_s:
                self.pipeline.remove(f"{fault.role}-churn{self._churned - 1}")
                self._assigned_at = 0.0
        elif self._churned == fault.times:
            self.healed_at = now
        else:
            self.pipeline.add(name, fault.role)
            self._churned += 1
            self._joined_at = now

    def _garbage(self, fault: Garbage) -> None:
        """The hostile records, in one go, onto the first partition of ``fault.partitions``
        streams spread over the environment's."""
        assert self.settings is not None, f"{self.scenario.name}: garbage needs the settings"
        s = self.settings
        self.at_strike = self.snapshot()
        streams = s.topology.stream_names()
        step = max(len(streams) // fault.partitions, 1)
        records = hostile.catalog("hostile", s.max_envelope_bytes)
        for n in range(fault.partitions):
            topic, partition = streams[(n * step) % len(streams)], n % s.partitions
            landed = hostile.write(s.kafka_bootstrap, topic, partition, "hostile", records)
            self.garbage.update(zip(landed, records, strict=True))
        self.struck_at = self.healed_at = time.monotonic()

    def _moves(self) -> None:
        if self.operator is None:
            if self._due(self.scenario.when):
                assert self.settings is not None, f"{self.scenario.name}: moves need the settings"
                self.at_strike = self.snapshot()
                self.struck_at = time.monotonic()
                self.operator = Operator(self.settings)
                self.operator.start()
        elif self.healed_at is None and self.operator.finished.is_set():
            self.healed_at = time.monotonic()

    def _kill(self, fault: ServerKill | LongOutage | OutboxServerKill) -> None:
        svc = self.services
        assert svc is not None, f"{self.scenario.name}: a server fault needs its own"
        server = (
            fault.server
            if isinstance(fault, ServerKill)
            else "postgres"
            if isinstance(fault, OutboxServerKill)
            else "kafka"
        )
        kill, start = {
            "kafka": (svc.kafka_kill, svc.kafka_start),
            "redis": (svc.redis_kill, svc.redis_start),
            "postgres": (svc.postgres_kill, svc.postgres_start),
        }[server]
        self.at_strike = self.snapshot()
        kill()
        self.struck_at = time.monotonic()

        def heal() -> None:
            try:
                time.sleep(fault.down_s)
                start()
                self.healed_at = time.monotonic()
            except BaseException as exc:  # reported as the row's problem
                self._heal_error = exc

        # The pipeline is supervised while the server is down and coming back.
        self._healer = threading.Thread(target=heal, name="chaos-heal", daemon=True)
        self._healer.start()

    def wait_healed(self, timeout: float) -> None:
        if self._healer is not None:
            self._healer.join(timeout)

    def problems(self) -> list[str]:
        fault = self.scenario.fault
        if isinstance(fault, Poison | RouterPoison | FailingCommands):
            return []
        if self._extra is not None:
            return self._extra.problems()
        if self._heal_error is not None:
            return [f"the fault was not healed: {self._heal_error}"]
        if self.drill is not None:
            return self.drill.problems()
        if self.struck_at is None:
            return [f"the fault never struck ({self.scenario.fault}, {self.scenario.when})"]
        if self.healed_at is None:
            return ["the fault struck but was not healed"]
        if isinstance(self.scenario.when, AfterApplied) and not (
            0 <= self.at_strike.get("applied", -1) < self.expected
        ):
            # Struck once everything was applied (or unknown): it tested an idle pipeline.
            return [f"the fault did not strike under load: {self.at_strike}"]
        if isinstance(fault, OutboxServerKill):
            written, published = (
                self.at_strike.get("written", -1),
                self.at_strike.get("published", -1),
            )
            if not (0 <= written < self.total and 0 <= published < written):
                return [f"PostgreSQL was killed outside a write and a publish: {self.at_strike}"]
            # The publisher may ride a short outage out in its pool's wait; one that outlasts it
            # ends the process with the one line naming the server, and the restart carries on.
            publisher = self.pipeline.members[PUBLISHER]
            for n, code in enumerate(publisher.exits[:-1]):
                said = publisher.log(n).read_text(errors="replace")
                if code != 2 or "rhumbatron: PostgreSQL at" not in said:
                    return [f"the publisher's start {n} exited {code}, not with the server named"]
        if isinstance(fault, LongOutage) or (
            isinstance(fault, ServerKill) and fault.server == "kafka"
        ):
            published = self.at_strike.get("published", -1)
            if not 0 <= published < self.total:
                return [
                    f"the broker was killed once the publisher had nothing left: {self.at_strike}"
                ]
        if isinstance(fault, Churn):
            # A join that never held a partition moved nothing: the storm was milder than said.
            idle = [
                m.role
                for m in self.pipeline.left
                if "assigned" not in m.log(0).read_text(errors="replace")
            ]
            if idle:
                return [f"members that never got a partition: {', '.join(idle)}"]
        if isinstance(fault, OperatorMoves) and self.operator is not None:
            return self.operator.problems + self.operator.unaudited()
        if isinstance(fault, Freeze):
            zombie = self.pipeline.members[fault.role].log(0).read_text(errors="replace")
            if "is stale" not in zombie:
                return [
                    "the frozen member's late write was not refused (no stale epoch in its log)"
                ]
        return []
