"""The publisher's faults that are more than a kill: a project the broker refuses until an
operator steps in (row 2), and a second publisher on the same outbox (row 3). Each is a drill
(faults.py ``Drill``): it strikes and heals from ``poll`` as the runner supervises the pipeline,
and says what went wrong with it in ``problems``."""

from __future__ import annotations

import base64
import dataclasses
import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

from router.settings import Settings
from streams.admin import admin_client, describe_configs
from streams.envelopes import Draft
from streams.outbox.store import OutboxRow
from tests.chaos.matrix import upgrade
from tests.chaos.matrix.faults import Drill
from tests.chaos.matrix.outboxes import RowOutbox
from tests.chaos.matrix.pipeline import Pipeline
from tests.chaos.matrix.scenarios import (
    PUBLISHER,
    AtEvent,
    RefusedProject,
    RollingUpgrade,
    Scenario,
    SecondPublisher,
)
from tests.support.environment import run_cli

# Who the operator's audited retry names.
OPERATOR = "chaos-matrix"
# A topic config change reaches the broker's cache asynchronously: waited for, this long at most.
CONFIG_WAIT_S = 30.0
HELD_LIMIT = 100  # held projects asked for; the row holds one
STANDBY = f"{PUBLISHER}-standby"
# What a publisher that finds the lease held says as it stands by (router/cli/outbox_commands.py).
STANDING_BY = "standing by: "


def refused(scenario: Scenario, drafts: Sequence[Draft]) -> tuple[list[Draft], str | None]:
    """The workload with the refused project's events, from the one ``when`` names on, grown
    past its stream's limit, and that project."""
    fault = scenario.fault
    if not isinstance(fault, RefusedProject):
        return list(drafts), None
    assert isinstance(scenario.when, AtEvent), f"{scenario.name}: a refused project starts AtEvent"
    out = list(drafts)
    at = int(len(out) * scenario.when.fraction)
    project = out[at].project_id
    # Random bytes, as text: the producer's compression cannot bring them under the limit.
    noise = random.Random(scenario.name)
    for n in range(at, len(out)):
        if out[n].project_id == project:
            blob = base64.b64encode(noise.randbytes(fault.record_bytes * 3 // 4)).decode()
            out[n] = dataclasses.replace(out[n], payload={**out[n].payload, "blob": blob})
    return out, project


def _set_limit(s: Settings, stream: str, limit: int | None) -> None:
    """Set the stream's ``max.message.bytes`` (None: back to the broker's default), and wait
    until the broker shows it."""
    base = s.kafka_config()
    admin = admin_client(base)
    op = AlterConfigOpType.SET if limit is not None else AlterConfigOpType.DELETE
    entry = ConfigEntry("max.message.bytes", str(limit or ""), incremental_operation=op)
    resource = ConfigResource(ConfigResource.Type.TOPIC, stream, incremental_configs=[entry])
    for future in admin.incremental_alter_configs([resource]).values():
        future.result()
    deadline = time.monotonic() + CONFIG_WAIT_S
    while True:
        shown = describe_configs(admin, base, [stream], 10)[stream]["max.message.bytes"]
        if (shown == str(limit)) == (limit is not None):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{stream}: max.message.bytes still {shown} after {CONFIG_WAIT_S}s")
        time.sleep(0.2)


class RefusedProjectDrill:
    """Row 2. Before the pipeline starts, the project's stream gets its low size limit. The
    fault strikes when the project shows as held (its head row failed); ``held_s`` later the
    operator raises the limit and retries the row through the command line."""

    def __init__(
        self,
        fault: RefusedProject,
        s: Settings,
        outbox: RowOutbox,
        project: str,
        snapshot: Callable[[], dict[str, int]],
        logs: Path,
    ) -> None:
        self.fault = fault
        self.s = s
        self.outbox = outbox
        self.project = project
        self.stream = s.topology.stream_for(project)
        self.snapshot = snapshot
        self.logs = logs
        self.struck_at: float | None = None
        self.healed_at: float | None = None
        self.at_strike: dict[str, int] = {}
        self.failed: OutboxRow | None = None  # the head row as it was when the hold showed
        self.at_hold: dict[str, int] = {}  # rows published per project when the hold showed
        self.at_retry: dict[str, int] = {}  # and when the operator retried
        self.held_at_retry = False
        self.retry_exit: int | None = None

    def prepare(self) -> None:
        _set_limit(self.s, self.stream, self.fault.limit_bytes)

    def poll(self) -> None:
        now = time.monotonic()
        if self.struck_at is None:
            held = [
                h
                for h in self.outbox.store.held_projects(HELD_LIMIT)
                if h.project_id == self.project
            ]
            if held:
                self.failed = self.outbox.store.get(held[0].event_id)
                self.at_hold = self.outbox.published_by_project()
                self.at_strike = self.snapshot()
                self.struck_at = now
        elif self.healed_at is None and now - self.struck_at >= self.fault.held_s:
            self.at_retry = self.outbox.published_by_project()
            self.held_at_retry = any(
                h.project_id == self.project for h in self.outbox.store.held_projects(HELD_LIMIT)
            )
            _set_limit(self.s, self.stream, None)
            assert self.failed is not None
            done = run_cli(
                self.s,
                "outbox",
                "retry",
                self.failed.event_id,
                "--outbox",
                self.outbox.address,
                "--who",
                OPERATOR,
            )
            (self.logs / "operator.log").write_text(done.stdout + done.stderr)
            self.retry_exit = done.returncode
            self.healed_at = time.monotonic()

    def problems(self) -> list[str]:
        if self.struck_at is None or self.failed is None:
            return [f"project {self.project} was never held (its head row never failed)"]
        if self.healed_at is None:
            return ["the operator never retried the held row"]
        found: list[str] = []
        row = self.failed
        if row.attempts != self.s.outbox_max_row_attempts or "MSG_SIZE_TOO_LARGE" not in (
            row.last_error or ""
        ):
            found.append(
                f"the held row {row.event_id} failed after {row.attempts} attempts with "
                f"{row.last_error!r}, not the broker's size refusal after "
                f"outbox_max_row_attempts={self.s.outbox_max_row_attempts}"
            )
        if not self.held_at_retry:
            found.append(f"project {self.project} was no longer held when the operator came")
        mine_then, mine_later = (
            self.at_hold.get(self.project, 0),
            self.at_retry.get(self.project, 0),
        )
        if mine_later != mine_then:
            found.append(
                f"project {self.project} published {mine_later - mine_then} rows while held"
            )
        neighbours = {p for p in {*self.at_hold, *self.at_retry} if p != self.project}
        flowed = sum(self.at_retry.get(p, 0) - self.at_hold.get(p, 0) for p in neighbours)
        if flowed <= 0:
            found.append(f"no other project's row was published while {self.project} was held")
        if self.retry_exit != 0:
            found.append(f"`outbox retry` exited {self.retry_exit} (see operator.log)")
        audit = [
            a
            for a in self.outbox.store.audit_log(row.event_id, 10)
            if a.action == "retry" and a.who == OPERATOR
        ]
        if len(audit) != 1:
            found.append(f"the audit log holds {len(audit)} retries of {row.event_id}, not 1")
        return found

    def notes(self) -> dict[str, object]:
        """What the row's line in docs/reliability.md reports."""
        same_stream = [
            p
            for p in {*self.at_hold, *self.at_retry}
            if p != self.project and self.s.topology.stream_for(p) == self.stream
        ]
        return {
            "project": self.project,
            "held_slot": self.failed.slot if self.failed else None,
            "others_published_while_held": sum(
                self.at_retry.get(p, 0) - self.at_hold.get(p, 0)
                for p in {*self.at_hold, *self.at_retry}
                if p != self.project
            ),
            "same_stream_published_while_held": sum(
                self.at_retry.get(p, 0) - self.at_hold.get(p, 0) for p in same_stream
            ),
        }


class StandbyDrill:
    """Row 3. Once due, a second publisher joins the pipeline (supervised: an exit would be
    followed by another start, but a publisher that finds the lease held stands by instead of
    exiting); ``standby_s`` later the first is stopped and no longer restarted."""

    def __init__(
        self,
        fault: SecondPublisher,
        pipeline: Pipeline,
        due: Callable[[], bool],
        snapshot: Callable[[], dict[str, int]],
        total: int,
    ) -> None:
        self.fault = fault
        self.pipeline = pipeline
        self.due = due
        self.snapshot = snapshot
        self.total = total
        self.struck_at: float | None = None
        self.healed_at: float | None = None
        self.at_strike: dict[str, int] = {}
        self.at_handover: dict[str, int] = {}
        self.standby_exits = 0  # the standby's exits before the handover (none: it waits)
        self.first_exit: int | None = None

    def poll(self) -> None:
        now = time.monotonic()
        if self.struck_at is None:
            if self.due():
                self.at_strike = self.snapshot()
                self.pipeline.add(STANDBY, PUBLISHER)
                self.struck_at = now
        elif self.healed_at is None and now - self.struck_at >= self.fault.standby_s:
            self.at_handover = self.snapshot()
            self.standby_exits = len(self.pipeline.members[STANDBY].exits)
            self.pipeline.remove(PUBLISHER)
            first = next(m for m in self.pipeline.left if m.role == PUBLISHER)
            self.first_exit = first.exits[-1]
            self.healed_at = time.monotonic()

    def problems(self) -> list[str]:
        if self.struck_at is None:
            return ["the second publisher was never started"]
        if self.healed_at is None:
            return ["the first publisher was never stopped"]
        found: list[str] = []
        standby = next(
            (
                m
                for m in [*self.pipeline.members.values(), *self.pipeline.left]
                if m.role == STANDBY
            ),
            None,
        )
        assert standby is not None
        # One start, standing by until the handover, publishing after it, stopped with the rest.
        before = standby.exits[: self.standby_exits]
        if before:
            found.append(
                f"the second publisher exited {before} while the first held the lease, "
                "instead of standing by"
            )
        said = standby.log(0).read_text(errors="replace")
        if STANDING_BY not in said:
            found.append(f"the second publisher never said {STANDING_BY!r} (see its first log)")
        after = standby.exits[self.standby_exits :]
        if after != [0]:
            found.append(
                f"the second publisher did not take over and stop cleanly: its exits after the "
                f"handover were {after}, not [0]"
            )
        if self.first_exit != 0:
            found.append(f"the first publisher, stopped, exited {self.first_exit}, not 0")
        if not 0 <= self.at_handover.get("published", -1) < self.total:
            found.append(f"nothing was left to publish at the handover: {self.at_handover}")
        return found


def drill_for(
    scenario: Scenario,
    s: Settings,
    outbox: RowOutbox,
    pipeline: Pipeline,
    *,
    project: str | None,
    due: Callable[[], bool],
    snapshot: Callable[[], dict[str, int]],
    total: int,
    logs: Path,
) -> Drill | None:
    fault = scenario.fault
    if isinstance(fault, RefusedProject):
        assert project is not None
        return RefusedProjectDrill(fault, s, outbox, project, snapshot, logs)
    if isinstance(fault, SecondPublisher):
        return StandbyDrill(fault, pipeline, due, snapshot, total)
    if isinstance(fault, RollingUpgrade):
        return upgrade.UpgradeDrill(fault, s, pipeline, due, snapshot, logs)
    return None
