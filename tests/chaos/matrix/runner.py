"""One row of the matrix, end to end: a fresh environment (on private servers where the row
kills one), the workload written through the outbox in waves while the supervised pipeline runs,
the fault injected and healed, the pipeline drained to lag 0, a last idle run of each
subscription, then the invariants."""

from __future__ import annotations

import shutil
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from consumers.lag import group_lag
from consumers.runtime.types import TP
from router.settings import Settings
from router.wiring.provisioning import provision_environment
from router.wiring.subscription import redis_client, store
from streams.admin import admin_client
from streams.clock import SystemClock
from streams.envelopes import Draft, Event, decode_event
from streams.errors import EnvelopeError
from streams.outbox.store import RowState
from streams.workload import workload
from tests.chaos.matrix import (
    command_faults,
    commands,
    invariants,
    outbox_checks,
    publisher_faults,
    server_faults,
    strikes,
    upgrade,
    writers,
)
from tests.chaos.matrix.outboxes import RowOutbox
from tests.chaos.matrix.pipeline import Pipeline, drain
from tests.chaos.matrix.scenarios import (
    LEDGER,
    PUBLISHER,
    ROUTER,
    SUBSCRIPTIONS,
    AfterApplied,
    Failpoint,
    OperatorMoves,
    Scenario,
    Services,
)
from tests.support.environment import ROOT, cleanup_environment, make_settings
from tests.support.infra import PrivateServices
from tests.support.kafka import read_all
from tests.support.runtime_processes import runtime_settings

LOGS = ROOT / ".local" / "chaos"
POLL_S = 0.5
DONE_EVERY_S = 2.0  # asking the broker for lag is dearer than supervising
DRAIN_IDLE_S = 3.0  # the final run's --until-idle
DRAIN_TIMEOUT_S = 120.0
# The ledger fails a drill event on every try; its backoff between tries is
# runtime_settings'. Batches are small so that a few thousand events make many batches and the
# fail-points' "Nth batch" falls mid-run.
BATCH = 50
WRITERS, EVENTS_PER_WRITE = 4, 5
ROWS_PER_PROJECT_PER_PASS = 10  # many publisher passes per wave: "the Nth pass" falls mid-run


@dataclass
class Row:
    row: int
    name: str
    services: str
    fault: str
    when: str
    events: int
    proves: str
    passed: bool = False
    seconds: float = 0.0
    drained_in_s: float | None = None
    struck_s: float | None = None  # when the fault struck, from the pipeline's start
    healed_s: float | None = None
    at_strike: dict[str, int] = field(default_factory=dict)  # rows published, effects applied
    copies: int = 0  # records on the streams beyond one per event (the publisher's re-sends)
    outbox: str = "sqlite"
    # Figures of the row's own: the writers' retried transactions, a held project's, ...
    notes: dict[str, object] = field(default_factory=dict)
    problems: dict[str, list[str]] = field(default_factory=dict)  # by invariant, and "fault"
    exits: dict[str, list[int]] = field(default_factory=dict)  # each member's exit codes
    logs: str = ""
    figures: dict[str, object] = field(default_factory=dict)  # the command side's counts

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def line(self) -> str:
        verdict = "PASS" if self.passed else "FAIL"
        held_all = " ".join(
            f"{name}:{'FAIL' if self.problems.get(name) else 'ok'}" for name in invariants.NAMES
        )
        drained = f"{self.drained_in_s:.1f}s" if self.drained_in_s is not None else "-"
        struck = f"{self.struck_s:.1f}s" if self.struck_s is not None else "-"
        return (
            f"{verdict} {self.row:>2} {self.name:<32} {held_all}  struck {struck:>6}  "
            f"drained {drained:>6}  {self.seconds:5.0f}s"
        )


def say(scenario: Scenario, text: str) -> None:
    print(f"chaos: [{scenario.name}] {text}", file=sys.stderr, flush=True)


@contextmanager
def servers(scenario: Scenario) -> Iterator[PrivateServices | None]:
    own = server_faults.private_services(scenario.services)
    if own is not None:
        with own as svc:
            yield svc
        return
    if scenario.services is Services.SHARED:
        yield None
        return
    with PrivateServices(
        kafka=scenario.services is Services.PRIVATE_KAFKA,
        redis=scenario.services is Services.PRIVATE_REDIS,
        postgres=scenario.services is Services.PRIVATE_POSTGRES,
    ) as svc:
        yield svc


def settings_for(svc: PrivateServices | None, scenario: Scenario) -> Settings:
    overrides: dict[str, object] = {"outbox_rows_per_project_per_pass": ROWS_PER_PROJECT_PER_PASS}
    overrides.update(scenario.settings)
    overrides.update(server_faults.settings_overrides(svc, scenario.services))
    if isinstance(scenario.fault, OperatorMoves):
        # The drill event then fails for ever, holding its partition until the operator skips it.
        overrides["failure_policies"] = {LEDGER: "block"}
    if scenario.services is Services.PRIVATE_KAFKA and svc is not None:
        overrides["kafka_bootstrap"] = svc.bootstrap
    if scenario.services is Services.PRIVATE_REDIS and svc is not None:
        overrides["redis_url"] = svc.redis_url
    s = runtime_settings(make_settings(**overrides), batch_size=BATCH)
    return commands.settings_for(s, scenario)


def run_row(scenario: Scenario) -> Row:
    row = Row(
        row=scenario.row,
        name=scenario.name,
        services=scenario.services.value,
        fault=repr(scenario.fault),
        when=repr(scenario.when),
        events=scenario.events,
        proves=scenario.proves,
        outbox=scenario.outbox.value,
    )
    logs = LOGS / scenario.name
    shutil.rmtree(logs, ignore_errors=True)
    logs.mkdir(parents=True)
    row.logs = str(logs.relative_to(ROOT))
    started = time.monotonic()
    try:
        with servers(scenario) as svc:
            s = settings_for(svc, scenario)
            say(scenario, f"environment {s.env} on {s.kafka_bootstrap}, {s.redis_url}")
            provision_environment(s)
            try:
                _run(scenario, s, svc, logs, row)
            finally:
                cleanup_environment(s)
    except Exception:  # a row that breaks is a failed row, the others still run
        row.problems.setdefault("fault", []).append(traceback.format_exc(limit=8))
    row.seconds = time.monotonic() - started
    row.passed = not any(row.problems.values())
    return row


def _waves(drafts: list[Draft], n: int) -> list[list[Draft]]:
    """Consecutive slices: written one after another, each project's events keep their order."""
    size = -(-len(drafts) // n)
    return [drafts[i : i + size] for i in range(0, len(drafts), size)]


def _run(
    scenario: Scenario, s: Settings, svc: PrivateServices | None, logs: Path, row: Row
) -> None:
    drafts, poison = strikes.poisoned(
        scenario, workload(scenario.name, scenario.projects, scenario.events)
    )
    drafts, refused = publisher_faults.refused(scenario, drafts)
    owed = len(drafts) - len(poison)  # what the ledger applies
    row_outbox = RowOutbox(scenario.outbox, s, svc)
    try:
        _run_on(scenario, s, svc, logs, row, row_outbox, drafts, poison, refused, owed)
    finally:
        row_outbox.close()


def _run_on(
    scenario: Scenario,
    s: Settings,
    svc: PrivateServices | None,
    logs: Path,
    row: Row,
    row_outbox: RowOutbox,
    drafts: list[Draft],
    poison: list[str],
    refused: str | None,
    owed: int,
) -> None:
    outbox = row_outbox.store
    side = scenario.commands
    member_env = server_faults.member_env(scenario, logs)
    if side is not None:
        member_env.update(commands.member_env(side))
    pipeline = Pipeline(
        server_faults.for_pipeline(s, svc, scenario.services),
        row_outbox.address,
        logs,
        strikes.armed(scenario),
        more=commands.members() if side is not None else None,
        more_env=member_env,
    )
    ledger = redis_client(s, timeout=2)
    # The ledger's per-partition counters, read by name: a scan of a shared Redis holding every
    # other test's keys takes seconds, and a fault due at 30% would strike a finished run.
    witness = store(s, ledger, LEDGER, SystemClock())
    counters = [
        witness.key(TP(topic, partition), "ledger:counts")
        for topic in s.topology.stream_names()
        for partition in range(s.partitions)
    ]

    def applied() -> int:
        pipe = ledger.pipeline(transaction=False)
        for key in counters:
            pipe.hlen(key)
        return sum(int(n) for n in pipe.execute())

    def snapshot() -> dict[str, int]:
        out = {"written": -1, "published": -1, "applied": -1}
        try:  # a server being killed is asked no questions
            counts = outbox.counts()
            out["written"] = sum(counts.values())
            out["published"] = counts.get(RowState.PUBLISHED, 0)
            out["applied"] = applied()
        except Exception:
            pass
        return out

    def due() -> bool:
        when = scenario.when
        assert isinstance(when, AfterApplied), f"{scenario.name}: a strike AfterApplied"
        try:
            return applied() >= owed * when.fraction
        except Exception:  # a busy server is asked again on the next poll
            return False

    drill = publisher_faults.drill_for(
        scenario,
        s,
        row_outbox,
        pipeline,
        project=refused,
        due=due,
        snapshot=snapshot,
        total=len(drafts),
        logs=logs,
    )
    if isinstance(drill, publisher_faults.RefusedProjectDrill | upgrade.UpgradeDrill):
        drill.prepare()
    injector = strikes.injector_for(
        scenario,
        pipeline,
        svc,
        applied,
        owed,
        snapshot,
        len(drafts),
        settings=s,
        logs=logs,
        drill=drill,
        drafts=drafts,
        poison=poison,
    )
    written = threading.Event()
    write_error: list[BaseException] = []
    tally = writers.WriteTally()
    writers.prepare(outbox)

    def writer() -> None:
        try:
            for n, wave in enumerate(_waves(drafts, scenario.waves)):
                if n:
                    time.sleep(scenario.wave_gap_s)
                writers.write(
                    outbox,
                    wave,
                    tally,
                    writers=WRITERS,
                    events_per_write=EVENTS_PER_WRITE,
                    hold_s=scenario.write_hold_s,
                )
        except BaseException as exc:  # the row reports it
            write_error.append(exc)
        finally:
            written.set()

    say(scenario, f"{len(drafts)} events over {scenario.projects} projects, {scenario.fault}")
    pipeline.start()
    began = time.monotonic()
    thread = threading.Thread(target=writer, name="chaos-writer", daemon=True)
    thread.start()
    written_at: float | None = None
    drained_at: float | None = None
    last_ask = 0.0
    try:
        while True:
            pipeline.supervise()
            injector.poll()
            now = time.monotonic()
            if written.is_set() and written_at is None:
                written_at = now
                say(scenario, "workload written")
            if written_at is not None and now - written_at > scenario.drain_bound_s:
                say(scenario, f"not drained within {scenario.drain_bound_s:.0f}s")
                break
            if written_at is not None and not injector.healing and now - last_ask > DONE_EVERY_S:
                last_ask = now
                if _drained(s, outbox, applied, owed) and (side is None or commands.drained(s)):
                    drained_at = now
                    break
            time.sleep(POLL_S)
    finally:
        pipeline.stop()
        injector.wait_healed(60)
    if write_error:
        raise write_error[0]
    assert written_at is not None
    row.drained_in_s = drained_at - written_at if drained_at is not None else None
    row.exits = pipeline.restarts()
    for line in injector.operator.done if injector.operator is not None else []:
        say(scenario, f"operator: {line}")
    say(scenario, f"drained in {row.drained_in_s}s; exits {row.exits}; the final idle runs")
    drains = {
        slug: drain(s, slug, logs, until_idle=DRAIN_IDLE_S, timeout=DRAIN_TIMEOUT_S, env=member_env)
        for slug in SUBSCRIPTIONS
    }
    if side is not None:
        drains.update(
            commands.final_runs(s, side, logs, until_idle=DRAIN_IDLE_S, timeout=DRAIN_TIMEOUT_S)
        )
    arrived, where = _arrived(s)
    row.copies = len(arrived) - len({e.event_id for e in arrived})
    row.at_strike = injector.at_strike
    if injector.struck_at is not None:
        row.struck_s = round(injector.struck_at - began, 1)
    if injector.healed_at is not None:
        row.healed_s = round(injector.healed_at - began, 1)
    evidence = invariants.Evidence(
        drafts=drafts,
        poison=poison,
        arrived=arrived,
        drains=drains,
        drained_in_s=row.drained_in_s,
        drain_bound_s=scenario.drain_bound_s,
        logs=logs,
        poisoned=command_faults.poisoned_for(scenario, poison),
        garbage=injector.garbage,
        where=where,
    )
    row.problems = invariants.check(s, outbox, evidence)
    row.problems["fault"] = injector.problems()
    stored = row_outbox.rows()
    found = outbox_checks.check(
        scenario,
        drafts,
        arrived,
        stored,
        row_outbox.counters(),
        s,
        write_retries=tally.retries,
    )
    for name, problems in found.items():
        row.problems[name].extend(problems)
    row.notes["write_retries"] = tally.retries
    # How hard the publisher was pushed: the most failed sends of one row, of either kind.
    row.notes["most_deferrals"] = max((r.deferrals for r in stored), default=0)
    row.notes["most_attempts"] = max((r.attempts for r in stored), default=0)
    row.notes["write_duplicates"] = tally.duplicates
    if isinstance(drill, publisher_faults.RefusedProjectDrill | upgrade.UpgradeDrill):
        row.notes.update(drill.notes())
    if side is not None:
        said = commands.gather(s, arrived, set(evidence.dead_by().get(ROUTER, [])), logs)
        found, row.figures = commands.check(s, scenario, said)
        for name, problems in found.items():
            row.problems.setdefault(name, []).extend(problems)
        row.problems["fault"].extend(commands.fault_problems(scenario, said))
    row.notes.update(getattr(injector, "notes", {}))
    if poison:
        row.notes["poison_tries"] = server_faults.poison_tries(logs, poison)
    # A fault's own checks beyond the invariants (the data loss row's letters).
    check_after = getattr(injector, "check_after", None)
    if check_after is not None:
        check_after(row.problems, poison, logs)
        row.notes.update(getattr(injector, "notes", {}))
    fault = scenario.fault
    if isinstance(fault, Failpoint) and fault.role == PUBLISHER and not row.copies:
        # The pass it acknowledged and never marked must go out again: no copy, no crash window.
        row.problems["fault"].append("the publisher's crash left no copy on the streams")


def _drained(s: Settings, outbox: Any, applied: Any, owed: int) -> bool:
    """Every row published, the ledger's effects all there, both groups at lag 0. Asked while
    servers may still be coming back: an error is "not yet"."""
    try:
        if outbox.counts().get(RowState.PUBLISHED, 0) < outbox_total(outbox):
            return False
        if applied() < owed:
            return False
        base = s.kafka_config()
        admin = admin_client(base)
        return all(
            sum(p.lag for p in group_lag(admin, base, s.topology.subscription_reads(slug), 10)) == 0
            for slug in SUBSCRIPTIONS
        )
    except Exception:  # asked again on the next round
        return False


def outbox_total(outbox: Any) -> int:
    return sum(outbox.counts().values())


def _arrived(s: Settings) -> tuple[list[Event], dict[tuple[str, int, int], str]]:
    """Every record on the streams (copies included), in partition order; and each one's place
    (topic, partition, offset) and event id."""
    consumer = Consumer({"bootstrap.servers": s.kafka_bootstrap, "group.id": "chaos-watermarks"})
    try:
        total = 0
        for topic in s.topology.stream_names():
            for partition in range(s.partitions):
                low, high = consumer.get_watermark_offsets(
                    TopicPartition(topic, partition), timeout=10
                )
                total += high - low
    finally:
        consumer.close()
    messages = read_all(s.kafka_bootstrap, s.topology.stream_names(), expect=total, timeout=120)
    # Records that are no event (a row's garbage) are left out: I3 accounts for them.
    limit = s.max_envelope_bytes
    events: list[Event] = []
    where: dict[tuple[str, int, int], str] = {}
    for m in messages:
        event = _event_or_none(m.value(), limit)
        if event is not None:
            events.append(event)
            where[(m.topic() or "", m.partition() or 0, m.offset() or 0)] = event.event_id
    return events, where


def _event_or_none(value: bytes | None, limit: int) -> Event | None:
    try:
        return decode_event(value, max_bytes=limit)
    except EnvelopeError:
        return None
