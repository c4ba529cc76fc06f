"""Injecting a row's fault, and knowing that it struck: a row whose fault never fired proves
nothing, so it fails (``Injector.problems``)."""

from __future__ import annotations

import dataclasses
import signal
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from router.settings import Settings
from streams.envelopes import Draft
from streams.failpoints import ENV as FAILPOINTS
from tests.chaos.matrix.moves import Operator
from tests.chaos.matrix.pipeline import Pipeline
from tests.chaos.matrix.scenarios import (
    AfterApplied,
    AtEvent,
    AtPass,
    Churn,
    Failpoint,
    Freeze,
    Garbage,
    OperatorMoves,
    Poison,
    Scenario,
    ServerKill,
)
from tests.support import hostile
from tests.support.infra import PrivateServices

# The ledger fails, every time, an event whose payload says so (consumers/subscriptions/ledger.py).
DRILL = {"drill": "fail"}


def armed(scenario: Scenario) -> dict[str, dict[str, str]]:
    """The extra environment of each member's first start."""
    fault, when = scenario.fault, scenario.when
    if isinstance(fault, Failpoint | Freeze):
        assert isinstance(when, AtPass), f"{scenario.name}: a fail-point strikes AtPass"
        mode = ":stop" if isinstance(fault, Freeze) else ""
        return {fault.role: {FAILPOINTS: f"{fault.point}@{when.nth}{mode}"}}
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
    if isinstance(scenario.fault, OperatorMoves):  # its drill event, for the skip-through
        fraction = scenario.fault.poison_at
    elif isinstance(scenario.fault, Poison):
        assert isinstance(scenario.when, AtEvent), f"{scenario.name}: a poison event sits AtEvent"
        fraction = scenario.when.fraction
    else:
        return list(drafts), []
    out = list(drafts)
    at = int(len(out) * fraction)
    out[at] = dataclasses.replace(out[at], payload={**out[at].payload, **DRILL})
    return out, [out[at].event_id]


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
        *,
        settings: Settings | None = None,  # where a fault that writes to the streams writes
    ) -> None:
        self.scenario = scenario
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
        if isinstance(fault, Failpoint):
            first = self.pipeline.members[fault.role].exits[:1]
            if first == [-signal.SIGKILL] and self.struck_at is None:
                self.struck_at = self.healed_at = time.monotonic()
                self.at_strike = self.snapshot()
        elif isinstance(fault, Freeze):
            self._freeze(fault)
        elif isinstance(fault, ServerKill) and self.struck_at is None:
            if self._due(when):
                self._kill(fault)
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
            if now - self._joined_at >= fault.every_s:
                self.pipeline.remove(f"{fault.role}-churn{self._churned - 1}")
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

    def _kill(self, fault: ServerKill) -> None:
        assert self.services is not None, f"{self.scenario.name}: a server fault needs its own"
        self.at_strike = self.snapshot()
        if fault.server == "kafka":
            self.services.kafka_kill()
        else:
            self.services.redis_kill()
        self.struck_at = time.monotonic()

        def heal() -> None:
            try:
                time.sleep(fault.down_s)
                assert self.services is not None
                if fault.server == "kafka":
                    self.services.kafka_start()
                else:
                    self.services.redis_start()
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
        if isinstance(fault, Poison):
            return []
        if self._heal_error is not None:
            return [f"the fault was not healed: {self._heal_error}"]
        if self.struck_at is None:
            return [f"the fault never struck ({self.scenario.fault}, {self.scenario.when})"]
        if self.healed_at is None:
            return ["the fault struck but was not healed"]
        if isinstance(self.scenario.when, AfterApplied) and not (
            0 <= self.at_strike.get("applied", -1) < self.expected
        ):
            # Struck once everything was applied (or unknown): it tested an idle pipeline.
            return [f"the fault did not strike under load: {self.at_strike}"]
        if isinstance(fault, ServerKill) and fault.server == "kafka":
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
