"""The main job, end to end on the real broker and Redis.

1. provision the environment's topics (the runtime commands it starts create none);
2. write a workload over many projects through the outbox with concurrent writers (plus a few
   drill events), and publish it;
3. run the subscriptions — project-view-projector, causal-router, audit-archiver,
   analytics-projector, and the ledger — each as its own consumer process, until idle;
4. run the command workers on the router's queues (one drill command is made to fail for good)
   and the dead-letter consumer;
5. print the figures, and leave the operator page running with the dead letters to look at.

Retry delays are shortened for the demo (a dead letter after seconds, not minutes); every other
setting is the environment's.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
from confluent_kafka import Message

from consumers.kafka_consumer import drain
from consumers.subscriptions.projector.view import count_views
from router.operator.pid_file import recorded_pid, running_server
from router.settings import QueuePolicy, Settings
from router.wiring.causal import open_router_outbox
from router.wiring.outbox import build_publisher, init_postgres_outbox
from router.wiring.provisioning import provision_environment
from router.wiring.subscription import redis_client
from streams.envelopes import Command, Draft, Event, build, encode
from streams.errors import ConfigurationError, EnvelopeError
from streams.files import open_private, private_dir, write_private
from streams.outbox.postgres import is_postgres_url
from streams.outbox.store import RowState
from streams.producer import Producer
from streams.topology import group_id, queue_name
from streams.workload import workload, write_workload

SUBSCRIPTIONS = (
    "project-view-projector",
    "causal-router",
    "audit-archiver",
    "analytics-projector",
    "ledger",
)
# The router's queues, each with the handler its demo worker runs.
WORKERS = {"integration": "drill", "indexing": "ok", "agent-wakeups": "flaky"}
DRILL_EVENTS = 3
IDLE_S = "5"
RETRY_DELAY_S = 1.0
# Bounds on the operator server starting, or an earlier one stopping (uvicorn's graceful stop
# takes well under a second); how often the demo looks meanwhile.
OPERATOR_WAIT_S = 30.0
OPERATOR_POLL_S = 0.1


def demo_settings(settings: Settings) -> Settings:
    """The environment's settings with retry delays short enough to watch."""
    queues = {
        purpose: QueuePolicy(**{**policy.model_dump(), "retry_delay_s": RETRY_DELAY_S})
        for purpose, policy in settings.queues.items()
    }
    return settings.model_copy(
        update={
            "queues": queues,
            "batch_retry_backoff_s": 0.2,
            "batch_retry_backoff_max_s": 1.0,
            "maintenance_enabled": False,
        }
    )


def run_demo(
    settings: Settings, *, projects: int, events: int, serve: bool = True, outbox: str | None = None
) -> int:
    """``outbox``: the environment's outbox for this run (``demo --outbox``), a SQLite file or a
    ``postgresql://`` URL whose outbox schema is made if missing; the writers, the router and the
    dead-letter consumer all write there, so each project keeps one slot sequence."""
    settings = demo_settings(settings)
    if outbox is not None:
        settings = settings.model_copy(update={"router_outbox_path": outbox})
    redis_client(settings).close()
    if outbox is not None and is_postgres_url(outbox):
        print(f"outbox: {init_postgres_outbox(settings, outbox)}")
    report = provision_environment(settings)
    print(f"provision: {report.summary()} in environment '{settings.env}'")

    run = secrets.token_hex(4)
    drafts = workload(run, projects, events) + drill_drafts(run)
    produced, expected = publish_through_outbox(settings, run=run, drafts=drafts, projects=projects)
    ordered = check_slot_order(settings, run=run, expected=expected, produced=produced)

    started = time.perf_counter()
    outcomes = run_all(
        settings, [["consume", "--subscription", s, "--until-idle", IDLE_S] for s in SUBSCRIPTIONS]
    )
    print(
        f"subscriptions: {len(SUBSCRIPTIONS)} consumer processes done in {time.perf_counter() - started:.1f}s"
    )
    for slug, (code, tail) in zip(SUBSCRIPTIONS, outcomes, strict=True):
        print(f"  {slug:<24} {'ok' if code == 0 else f'exit {code}'}  {tail}")

    send_drill_command(settings, run)
    started = time.perf_counter()
    worker_runs = [
        ["worker", "--queue", q, "--handler", h, "--until-idle", IDLE_S] for q, h in WORKERS.items()
    ]
    worker_outcomes = run_all(settings, worker_runs)
    dlc = run_all(settings, [["dead-letter-consumer", "--until-idle", IDLE_S]])
    print(
        f"command workers: {len(WORKERS)} workers and the dead-letter consumer done in {time.perf_counter() - started:.1f}s"
    )
    for (queue, handler), (code, tail) in zip(WORKERS.items(), worker_outcomes, strict=True):
        print(
            f"  {queue + ' (' + handler + ')':<24} {'ok' if code == 0 else f'exit {code}'}  {tail}"
        )
    print(
        f"  {'dead-letter-consumer':<24} {'ok' if dlc[0][0] == 0 else f'exit {dlc[0][0]}'}  {dlc[0][1]}"
    )

    print()
    print_figures(settings)
    if serve:
        print()
        serve_operator_page(settings)
    failed = [c for c, _ in outcomes + worker_outcomes + dlc if c != 0]
    return 0 if ordered and not failed else 1


def drill_drafts(run: str) -> list[Draft]:
    """A drill project whose last events the ledger refuses every time, so they end as dead
    letters an operator can look at (and retry or dismiss)."""
    drafts = workload(f"{run}-drill", 1, 5 + DRILL_EVENTS)
    return [
        replace(draft, payload={**draft.payload, "drill": "fail"})
        if n >= len(drafts) - DRILL_EVENTS
        else draft
        for n, draft in enumerate(drafts)
    ]


def publish_through_outbox(
    settings: Settings, *, run: str, drafts: list[Draft], projects: int
) -> tuple[dict[str, int], int]:
    """Write the workload through an outbox with concurrent writers, then run the publisher until
    the outbox is empty. Prints the write and publish figures; returns the rows published per
    stream and in all."""
    # The environment's outbox, which the router writes its own decisions to as well: one slot
    # sequence per project.
    store = open_router_outbox(settings)
    try:
        written = write_workload(
            store,
            drafts,
            writers=settings.produce_writers,
            events_per_write=settings.produce_events_per_write,
        )
        print(
            f"write: {written.events} events over {projects} projects (run {run}) into the outbox "
            f"{store.location}: {written.writes} transactions by {written.writers} concurrent writers in "
            f"{written.seconds:.2f}s"
        )
        with build_publisher(settings, store) as publisher:
            totals = publisher.run(until_empty=True)
        elapsed = max(time.monotonic() - totals.started, 1e-9)
        counts = store.counts()
        print(
            f"publish: {totals.published} rows published in {elapsed:.2f}s "
            f"({totals.published / elapsed:.0f} rows/s, {settings.outbox_ordering} ordering); "
            f"{totals.retries} retries, {counts[RowState.FAILED]} failed"
        )
        published = store.rows_in_state(RowState.PUBLISHED, written.events)
        per_stream = Counter(settings.topology.stream_for(row.project_id) for row in published)
    finally:
        store.close()
    return dict(per_stream), len(published)


def check_slot_order(
    settings: Settings, *, run: str, expected: int, produced: dict[str, int]
) -> bool:
    """Read the run's events back from the streams and check every project's slots arrived
    complete and in order."""
    prefix = f"proj-{run}-"
    slots: dict[str, list[int]] = defaultdict(list)
    consumed: dict[str, int] = defaultdict(int)
    seen = 0
    rejected: list[str] = []

    def handle(event: Event, message: Message) -> None:
        nonlocal seen
        if event.project_id.startswith(prefix):
            slots[event.project_id].append(event.slot or 0)
            consumed[message.topic() or "?"] += 1
            seen += 1

    def reject(message: Message, error: EnvelopeError) -> None:
        rejected.append(f"{message.topic()}[{message.partition()}]@{message.offset()}: {error}")

    drain(
        settings.kafka_config(),
        group_id=group_id("demo", settings.env),
        topics=settings.topology.stream_names(),
        handle=handle,
        reject=reject,
        protocol=settings.group_protocol,
        session_timeout_ms=settings.session_timeout_ms,
        max_envelope_bytes=settings.max_envelope_bytes,
        batch_size=settings.batch_size,
        until_idle_s=settings.demo_idle_s,
        until=lambda: seen >= expected,
        max_wait_s=settings.demo_max_wait_s,
        join_timeout_s=settings.group_join_timeout_s,
    )
    in_order = [p for p, s in slots.items() if s == list(range(1, len(s) + 1))]
    print()
    print(f"{'stream':<32}{'published':>10}{'consumed':>10}")
    for name in settings.topology.stream_names():
        print(f"{name:<32}{produced.get(name, 0):>10}{consumed.get(name, 0):>10}")
    print(f"{'total':<32}{sum(produced.values()):>10}{sum(consumed.values()):>10}")
    ok = len(in_order) == len(slots) and seen == expected
    print(
        f"slot order: {len(in_order)}/{len(slots)} projects arrived complete and in slot order: "
        f"{'yes' if ok else 'NO'}; {len(rejected)} rejected records"
    )
    print()
    return ok


def send_drill_command(settings: Settings, run: str) -> None:
    """One integration command that fails every attempt: after its retries it is dead-lettered,
    and the dead-letter consumer blocks its task through the router's outbox."""
    now = datetime.now(UTC)
    command = build(
        Command,
        command_id=f"cmd_drill_{run}",
        command_type="change.dispatch",
        project_id=f"proj-{run}-drill-00000",
        change_id=f"proj-{run}-drill-00000-chg1",
        task_id=f"proj-{run}-drill-00000-chg1-t0",
        created_at=now,
        deadline=now + timedelta(hours=1),
        payload={"drill": "fail", "reason": "demo drill"},
    )
    producer = Producer(settings.kafka_config())
    producer.produce(
        queue_name("integration", settings.env),
        encode(command, max_bytes=settings.max_envelope_bytes),
        key=command.project_id,
    )
    producer.flush(settings.flush_timeout_s)


def run_all(settings: Settings, commands: list[list[str]]) -> list[tuple[int, str]]:
    """Run ``rhumbatron`` subcommands as parallel processes; return each exit code and the last
    line it printed on stderr (its summary)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RHUMBATRON_")}
    env.update(settings.as_environment())
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "router.cli", *args],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for args in commands
    ]
    out = []
    for proc in procs:
        stdout, stderr = proc.communicate()
        lines = [
            line
            for line in (stderr.strip().splitlines() + stdout.strip().splitlines())
            if line.strip()
        ]
        out.append((proc.returncode, lines[-1][:150] if lines else ""))
    return out


def print_figures(settings: Settings) -> None:
    from router.operator.queues import commands_by_type
    from router.wiring.analytics import count_points
    from router.wiring.archive import archived_events, count_parts
    from router.wiring.subscription import dead_letters
    from router.wiring.workers import worker_figures

    client = redis_client(settings)
    letters = dead_letters(settings, client).list()
    figures: dict[str, Any] = {
        "project views built": count_views(client, settings.env),
        "commands by type": commands_by_type(settings),
        "archive parts": count_parts(settings),
        "events archived today": archived_events(settings),
        "metric points": count_points(settings),
        "dead letters": dict(Counter(f"{d.kind} ({d.status})" for d in letters)),
        "workers": worker_figures(settings, client)["queues"],
    }
    print(f"figures for environment '{settings.env}' (totals so far, this run included)")
    for name, value in figures.items():
        text = value if isinstance(value, int) else orjson.dumps(value).decode()
        print(f"  {name:<24} {text}")


def serve_operator_page(settings: Settings) -> None:
    """Leave the operator page running in the background (it outlives this command). Its files
    are in the state directory, readable by this user only (0600): the pid file the server holds
    while it runs, the operator token, the log. The token is never printed: it is in its file."""
    state = private_dir(settings.state_dir)
    pid_file, token_file, log_path = (
        state / "operator.pid",
        state / "operator-token",
        state / "operator.log",
    )
    stop_earlier_operator_server(pid_file)
    token = (
        settings.operator_token.get_secret_value()
        if settings.operator_token
        else secrets.token_urlsafe(32)
    )
    write_private(token_file, token + "\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RHUMBATRON_")}
    env.update(settings.as_environment())
    env["RHUMBATRON_OPERATOR_TOKEN"] = token
    with open(open_private(log_path, os.O_WRONLY | os.O_TRUNC, tighten=True), "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "router.cli", "serve", "--pid-file", str(pid_file)],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    address = _operator_address(settings, proc, log_path)
    print(f"operator page: {address}  (the operator token is in {token_file}, mode 0600)")
    print(f"  stop it with: kill $(cat {pid_file})   log: {log_path}")


def stop_earlier_operator_server(pid_file: Path) -> None:
    """Stop the operator server an earlier run left, if it still runs: the one holding
    ``pid_file`` (router/operator/pid_file.py). A pid in a file no server holds is stale, maybe
    another process's by now: it is left alone."""
    pid = running_server(pid_file)
    if pid is None:
        stale = recorded_pid(pid_file)
        if stale is not None:
            print(
                f"note: {pid_file} names pid {stale}, which is no operator server of this state "
                "directory (none holds the file): left alone"
            )
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + OPERATOR_WAIT_S
    while running_server(pid_file) is not None and time.monotonic() < deadline:
        time.sleep(OPERATOR_POLL_S)
    print(f"stopped the operator server of an earlier run (pid {pid})")


def _operator_address(settings: Settings, proc: subprocess.Popen[bytes], log_path: Path) -> str:
    """The address the server prints once it listens (the port may be a free one it chose);
    one clear error with the log's last line if it exits instead."""
    deadline = time.monotonic() + OPERATOR_WAIT_S
    while time.monotonic() < deadline:
        lines = log_path.read_text(errors="replace").splitlines()
        started = [ln for ln in lines if ln.startswith("operator page at ")]
        if started:
            return started[0].split()[3]
        if proc.poll() is not None:
            last = lines[-1].removeprefix("rhumbatron: ") if lines else f"exit {proc.returncode}"
            raise ConfigurationError(f"the operator server did not start: {last} (log: {log_path})")
        time.sleep(OPERATOR_POLL_S)
    return f"http://{settings.operator_host}:{settings.operator_port}/ (still starting)"
