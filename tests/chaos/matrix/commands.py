"""The command side of a row (``Scenario.commands``): the causal router and one worker per queue
it writes to (tests/chaos/matrix/command_worker.py), in the pipeline; the row's settings for
them; when they are drained; their last idle runs; the evidence they left, read back from the
servers; and the part of the checks that asks the servers (I5: lag 0 for the router and every
worker group, no effect left pending in the router's progress). The rest of the checks is
tests/chaos/matrix/command_checks.py, which asks no server.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import cast

import orjson
from confluent_kafka import Message

from consumers.lag import group_lag
from consumers.runtime.types import TP
from consumers.topic_reader import read_committed
from router.operator.queues import read_commands
from router.settings import QueuePolicy, Settings
from router.wiring.subscription import redis_client, store
from router.wiring.workers import worker_slug
from streams.admin import admin_client
from streams.clock import SystemClock
from streams.envelopes import Command, Event, decode_command
from streams.headers import ATTEMPT, ATTEMPTS, header_int
from streams.topology import queue_name, retry_topic
from tests.chaos.matrix import command_checks
from tests.chaos.matrix.command_checks import CommandEvidence, Rules
from tests.chaos.matrix.command_worker import (
    FAILURES_ENV,
    JOURNAL_ENV,
    journal_client,
    read_journal,
)
from tests.chaos.matrix.pipeline import consume_args
from tests.chaos.matrix.scenarios import (
    COMMAND_QUEUES,
    ROUTER,
    Churn,
    CommandSide,
    FailingCommands,
    Failpoint,
    Freeze,
    Scenario,
    TransactionalZombie,
    worker_role,
)
from tests.support.causal_router import drive, make_router, open_test_outbox
from tests.support.environment import ROOT, TEST_REDIS, subprocess_env

SHOWN = 5
DEAD_LETTER = "dead-letter"
# What a worker logs when a transaction of its commands failed and was aborted: they are read
# again at the same attempt (router/workers/worker.py).
ABORTED = "record(s) failed ("


def settings_for(s: Settings, scenario: Scenario) -> Settings:
    """With the command side, what it needs: the router's outbox in the row's state, no
    maintenance tick (its commands follow the wall clock, not the workload), each queue's
    retries and delay (the row's own settings are in ``s`` already)."""
    values: dict[str, object] = {}
    side = scenario.commands
    if side is not None:
        values.setdefault("router_outbox_path", str(s.state_dir / "router-outbox.sqlite"))
        values.setdefault("maintenance_enabled", False)
        values.setdefault(
            "queues",
            {
                purpose: QueuePolicy(
                    batch=policy.batch,
                    retries=side.retries if purpose != DEAD_LETTER else policy.retries,
                    retry_delay_s=side.retry_delay_s,
                    max_in_flight=policy.max_in_flight,
                    dead_letter=policy.dead_letter,
                )
                for purpose, policy in s.queues.items()
            },
        )
    if not values:
        return s
    return Settings(**{**s.model_dump(), **values})


def worker_args(queue: str, *, until_idle: float | None = None) -> list[str]:
    args = [sys.executable, "-m", "tests.chaos.matrix.command_worker", "--queue", queue]
    return args + (["--until-idle", str(until_idle)] if until_idle is not None else [])


def members() -> dict[str, list[str]]:
    """The command side's processes, by role."""
    return {
        ROUTER: consume_args(ROUTER),
        **{worker_role(q): worker_args(q) for q in COMMAND_QUEUES},
    }


def member_env(side: CommandSide) -> dict[str, str]:
    return {FAILURES_ENV: side.failures.as_env(), JOURNAL_ENV: TEST_REDIS}


def _lags(s: Settings) -> dict[str, int]:
    base = s.kafka_config()
    admin = admin_client(base)
    reads = [s.topology.subscription_reads(ROUTER)] + [
        s.topology.worker_reads(worker_slug(q), q) for q in COMMAND_QUEUES
    ]
    return {
        r.name: sum(p.lag for p in group_lag(admin, base, r, s.connect_timeout_s)) for r in reads
    }


def drained(s: Settings) -> bool:
    """The router and every worker group at lag 0 (a retry waiting for its due time is not
    committed, so its retry topic lags). Asked while servers may be coming back: an error is
    "not yet"."""
    try:
        return not any(_lags(s).values())
    except Exception:
        return False


def final_runs(
    s: Settings, side: CommandSide, logs: Path, *, until_idle: float, timeout: float
) -> dict[str, int]:
    """The router and each worker once more with ``--until-idle``, side by side: each exits 0
    only once nothing waits (no retry, no pending effect) and it read everything. Exit codes by
    role (-9: not idle within ``timeout``)."""
    env = subprocess_env(s, **member_env(side))
    runs = {ROUTER: consume_args(ROUTER, until_idle=until_idle)} | {
        worker_role(q): worker_args(q, until_idle=until_idle) for q in COMMAND_QUEUES
    }
    procs = {}
    for role, args in runs.items():
        with (logs / f"{role}.drain.log").open("wb") as out:
            procs[role] = subprocess.Popen(
                args, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT
            )
    codes = {}
    for role, proc in procs.items():
        try:
            codes[role] = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            codes[role] = -signal.SIGKILL
    return codes


def decided(s: Settings, arrived: Sequence[Event], dead: set[str]) -> list[Command]:
    """What the rules decide for the events as they arrived (each once, in partition order, so
    each project's in its stream order), ``dead`` (those the router dead-lettered) left out."""
    seen: set[str] = set()
    events = []
    for e in arrived:
        if e.event_id in seen or e.event_id in dead:
            continue
        seen.add(e.event_id)
        events.append(e)
    with tempfile.TemporaryDirectory() as tmp:
        outbox = open_test_outbox(Path(tmp) / "oracle-outbox.sqlite")
        router = make_router(
            outbox,
            agents_per_change=s.agents_per_change,
            commands_per_change_per_day=s.commands_per_change_per_day,
            calls_per_day=s.classifier_calls_per_day,
            threshold=s.classifier_threshold,
            history=s.router_fold_history,
            env=s.env,
        )
        return drive(router, events)


def _read(s: Settings, topics: list[str], visit: Callable[[Message], None]) -> None:
    timeout = s.transaction_timeout_ms / 1000 + s.flush_timeout_s
    read_committed(s.kafka_config(), topics, visit, timeout_s=timeout)


def retried(s: Settings) -> Counter[tuple[str, int]]:
    """(command id, attempt) of every record on the retry topics (read committed)."""
    out: Counter[tuple[str, int]] = Counter()

    def visit(message: Message) -> None:
        headers = cast(list[tuple[str, bytes]], message.headers() or [])
        command = decode_command(message.value(), max_bytes=s.max_envelope_bytes)
        out[(command.command_id, header_int(headers, ATTEMPT, 1))] += 1

    _read(s, [retry_topic(q, s.env) for q in COMMAND_QUEUES], visit)
    return out


def dead_lettered(s: Settings) -> list[tuple[Command, int]]:
    """Every command on the dead-letter queue (read committed), with its attempts header."""
    out: list[tuple[Command, int]] = []

    def visit(message: Message) -> None:
        headers = cast(list[tuple[str, bytes]], message.headers() or [])
        command = decode_command(message.value(), max_bytes=s.max_envelope_bytes)
        out.append((command, header_int(headers, ATTEMPTS, -1)))

    _read(s, [queue_name(DEAD_LETTER, s.env)], visit)
    return out


def workers_killed(scenario: Scenario) -> bool:
    """A row that kills or freezes a worker may see a handler run again at the same attempt
    (its completion not yet recorded when it died): at least once, by design (docs/queues.md).
    The effect is still once (its idempotency key)."""
    fault = scenario.fault
    role = getattr(fault, "role", None)
    return isinstance(fault, Failpoint | Freeze | TransactionalZombie) and bool(
        role and str(role).startswith("worker-")
    )


def gather(
    s: Settings, arrived: Sequence[Event], router_dead: set[str], logs: Path
) -> CommandEvidence:
    """What the command side left; the journal is kept beside the members' logs."""
    queued = read_commands(s)
    client = journal_client(s.model_copy(update={"redis_url": TEST_REDIS}))
    journal = read_journal(client, s.env)
    if s.redis_url != TEST_REDIS:  # the row's own Redis goes with its servers; this one stays
        for key in client.scan_iter(match=f"rh:{s.env}:{{chaos}}:*"):  # journal and effects
            client.delete(key)
    (logs / "journal.jsonl").write_bytes(b"".join(orjson.dumps(asdict(x)) + b"\n" for x in journal))
    aborted = {
        q
        for q in COMMAND_QUEUES
        if any(
            ABORTED in path.read_text(errors="replace")
            for path in logs.glob(f"{worker_role(q)}*.log")
        )
    }
    return CommandEvidence(
        decided=decided(s, arrived, router_dead),
        queued=queued.commands,
        undecodable=queued.undecodable,
        retried=retried(s),
        dead=dead_lettered(s),
        journal=journal,
        aborted=aborted,
    )


def clean_end(s: Settings) -> list[str]:
    """I5 of the command side (the last idle runs' exits are checked with the subscriptions')."""
    found = [f"{name}: lag {lag}" for name, lag in _lags(s).items() if lag]
    progress = store(s, redis_client(s), ROUTER, SystemClock())
    for topic in s.topology.stream_names():
        for partition in range(s.partitions):
            at = progress.load(TP(topic, partition))
            if at.pending_effects or at.applied_beyond or at.dead:
                found.append(
                    f"{ROUTER}: {topic}[{partition}] left pending_effects={at.pending_effects} "
                    f"applied_beyond={at.applied_beyond[:SHOWN]} dead={at.dead[:SHOWN]}"
                )
    return found


def check(
    s: Settings, scenario: Scenario, e: CommandEvidence
) -> tuple[dict[str, list[str]], dict[str, object]]:
    """The command side's problems by invariant, and the row's figures."""
    side = scenario.commands
    assert side is not None
    rules = Rules(
        failures=side.failures,
        retries=side.retries,
        retry_delay_s=side.retry_delay_s,
        dead_letter=frozenset(q for q, p in s.queues.items() if p.dead_letter is not None),
        workers_killed=workers_killed(scenario),
    )
    found, figures = command_checks.check(e, rules)
    found["I5"] = clean_end(s)
    fault = scenario.fault
    if isinstance(fault, Churn) and fault.role.startswith("worker-"):
        queue = fault.role.removeprefix("worker-")
        figures["retries_through_a_rebalance"] = command_checks.waited_through_a_move(
            e.journal, queue
        )
    return found, figures


def fault_problems(scenario: Scenario, e: CommandEvidence) -> list[str]:
    """Whether the command side's fault struck what it targets."""
    fault = scenario.fault
    if isinstance(fault, FailingCommands):
        if not any(x.what == "fail" for x in e.journal):
            return ["no command failed: the failure rule struck nothing"]
        if not e.dead:
            return ["no command reached the dead-letter queue"]
    if isinstance(fault, Churn) and fault.role.startswith("worker-"):
        queue = fault.role.removeprefix("worker-")
        if not command_checks.waited_through_a_move(e.journal, queue):
            return [f"no retry of {queue} waited through a rebalance of its workers"]
    return []
