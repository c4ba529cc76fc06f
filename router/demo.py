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
setting is the environment's, but for the metrics port. With ``metrics_port`` P (not 0) the demo
serves its own endpoint on P and its children take P+1, P+2, … in the order of ``CHILD_ROLES``
(the five subscriptions, the three workers, the dead-letter consumer, the operator server): fixed
ports, so one scrape configuration fits every run. With 0 each child picks a free port; unset,
none serves one. The demo prints each child's metrics URL as the child announces it.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import IO, Any

import orjson
from confluent_kafka import Message

from consumers.kafka_consumer import drain
from consumers.subscriptions.projector.view import count_views
from router.operator.pid_file import recorded_pid, running_server
from router.settings import QueuePolicy, Settings
from router.wiring.causal import open_router_outbox
from router.wiring.outbox import build_publisher, init_postgres_outbox
from router.wiring.provisioning import provision_environment
from router.wiring.pump import open_pump
from router.wiring.subscription import redis_client
from streams.envelopes import Command, Draft, Event, build, encode
from streams.errors import ConfigurationError, EnvelopeError
from streams.files import open_private, private_dir, write_private
from streams.outbox.store import RowState, is_postgres_url
from streams.producer import Producer
from streams.pump.identity import Identity
from streams.pump.reference_server import FeedServer, workload_feed
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
# The demo's child processes, named by their process role, in the order they take metrics ports
# after the demo's own: P+1, P+2, …
CHILD_ROLES = (
    *SUBSCRIPTIONS,
    *(f"worker-{queue}" for queue in WORKERS),
    "dead-letter-consumer",
    "operator",
)
# What a process prints on stderr once its endpoint listens (router/wiring/probes.py).
ENDPOINT_SAID = ": metrics endpoint "
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


def child_metrics_port(settings: Settings, role: str) -> int | None:
    """The metrics port of the demo's child ``role``: P + 1 + its place in ``CHILD_ROLES`` when
    ``metrics_port`` is P (not 0); 0 (any free port) when it is 0; None (no endpoint) unset."""
    base = settings.metrics_port
    if not base:
        return base
    port = base + 1 + CHILD_ROLES.index(role)
    if port > 65535:
        raise ConfigurationError(
            f"metrics_port={base}: the demo's {len(CHILD_ROLES)} child processes take the ports "
            f"after it, up to {base + len(CHILD_ROLES)}, past 65535; set RHUMBATRON_METRICS_PORT "
            f"to at most {65535 - len(CHILD_ROLES)}, or 0 for free ports"
        )
    return port


def child_environment(settings: Settings, role: str) -> dict[str, str]:
    """The environment of the demo's child ``role``: this process's, less its ``RHUMBATRON_*``
    variables, plus ``settings`` with the child's own metrics port (``child_metrics_port``)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RHUMBATRON_")}
    env.update(settings.as_environment())
    port = child_metrics_port(settings, role)
    if port is not None:
        env["RHUMBATRON_METRICS_PORT"] = str(port)
    return env


def run_demo(
    settings: Settings,
    *,
    projects: int,
    events: int,
    serve: bool = True,
    outbox: str | None = None,
    beat: Callable[[], None] = lambda: None,
) -> int:
    """``outbox``: the environment's outbox for this run (``demo --outbox``), a SQLite file or a
    ``postgresql://`` URL whose outbox schema is made if missing; the writers, the router and the
    dead-letter consumer all write there, so each project keeps one slot sequence. ``beat`` is
    called while the demo waits (its health beat)."""
    settings = demo_settings(settings)
    child_metrics_port(settings, CHILD_ROLES[-1])  # a base port too high is refused up front
    if outbox is not None:
        settings = settings.model_copy(update={"router_outbox_path": outbox})
    redis_client(settings).close()
    if outbox is not None and is_postgres_url(outbox):
        print(f"outbox: {init_postgres_outbox(settings, outbox)}")
    report = provision_environment(settings)
    print(f"provision: {report.summary()} in environment '{settings.env}'")

    run = secrets.token_hex(4)
    drafts = workload(run, projects, events) + drill_drafts(run)
    produced, expected = publish_through_outbox(
        settings, run=run, drafts=drafts, projects=projects, beat=beat
    )
    ordered = check_slot_order(settings, run=run, expected=expected, produced=produced, beat=beat)
    pump_reference_feed(settings, run)

    started = time.perf_counter()
    outcomes = run_all(
        settings,
        [(s, ["consume", "--subscription", s, "--until-idle", IDLE_S]) for s in SUBSCRIPTIONS],
        beat,
    )
    print(
        f"subscriptions: {len(SUBSCRIPTIONS)} consumer processes done in {time.perf_counter() - started:.1f}s"
    )
    for slug, (code, tail) in zip(SUBSCRIPTIONS, outcomes, strict=True):
        print(f"  {slug:<24} {'ok' if code == 0 else f'exit {code}'}  {tail}")

    send_drill_command(settings, run)
    started = time.perf_counter()
    worker_runs = [
        (f"worker-{q}", ["worker", "--queue", q, "--handler", h, "--until-idle", IDLE_S])
        for q, h in WORKERS.items()
    ]
    worker_outcomes = run_all(settings, worker_runs, beat)
    dlc = run_all(
        settings, [("dead-letter-consumer", ["dead-letter-consumer", "--until-idle", IDLE_S])], beat
    )
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


FEED_EVENTS = 300
FEED_PROJECTS = 6
FEED_CORPUS = "0d3c6c5e-58f1-4c1e-9a37-6f1f8d0c2b11"
FEED_LINEAGE = "5b7e2f4a-0c9d-4e3b-8a61-2d4c9e8f1a70"


def pump_reference_feed(settings: Settings, run: str) -> None:
    """The feed pump over the reference feed: a file of FEED_EVENTS events served on 127.0.0.1,
    pumped once (identity first, then batches with their checkpoints), then once more to show a
    resumed run publishes nothing twice."""
    path = settings.state_dir / f"demo-feed-{run}.ndjson"
    lines = workload_feed(f"feed{run}", FEED_PROJECTS, FEED_EVENTS)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    server = FeedServer(path, Identity(FEED_CORPUS, FEED_LINEAGE), page_size=100).start()
    try:
        started = time.perf_counter()
        with open_pump(settings, server.url) as pump:
            first = pump.pass_once()
        seconds = max(time.perf_counter() - started, 1e-9)
        with open_pump(settings, server.url) as pump:
            again = pump.pass_once()
    finally:
        server.close()
        path.unlink(missing_ok=True)
    at = first.checkpoint.sequence if first.checkpoint else "none"
    print(
        f"pump: {first.published} events from the reference feed {server.url} in "
        f"{first.batches} transactions over {first.pages} pages in {seconds:.2f}s; checkpoint "
        f"sequence {at}; run again: {again.published} published"
    )


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
    settings: Settings,
    *,
    run: str,
    drafts: list[Draft],
    projects: int,
    beat: Callable[[], None] = lambda: None,
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
            totals = publisher.run(until_empty=True, tick=beat)
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
    settings: Settings,
    *,
    run: str,
    expected: int,
    produced: dict[str, int],
    beat: Callable[[], None] = lambda: None,
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

    def read_enough() -> bool:
        beat()  # drain asks once each time round its loop
        return seen >= expected

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
        until=read_enough,
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


def run_all(
    settings: Settings,
    runs: list[tuple[str, list[str]]],
    beat: Callable[[], None] = lambda: None,
) -> list[tuple[int, str]]:
    """Run ``rhumbatron`` subcommands, each ``(role, args)``, as parallel processes; return each
    exit code and the last line it printed on stderr (its summary). A child's metrics URL is
    printed as it announces it; ``beat`` is called every ``demo_beat_interval_s`` meanwhile."""
    children = [_Child(role, args, child_environment(settings, role)) for role, args in runs]
    out = []
    for child in children:
        while True:
            try:
                child.proc.wait(timeout=settings.demo_beat_interval_s)
                break
            except subprocess.TimeoutExpired:
                beat()
        out.append((child.proc.returncode, child.last_line()))
    return out


def print_metrics_url(role: str, said: str) -> None:
    """One line naming a child's role and its metrics URL, from the line the child printed when
    its endpoint started listening (nothing for any other line)."""
    _, found, url = said.partition(ENDPOINT_SAID)
    if found:
        print(f"  metrics of {role:<24} {url.strip()}", flush=True)


class _Child:
    """One child process, its output read by threads as it comes (so a metrics URL is printed
    while the child runs, and neither pipe fills up)."""

    def __init__(self, role: str, args: list[str], env: dict[str, str]) -> None:
        self.role = role
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "router.cli", *args],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.stdout: list[str] = []
        self.stderr: list[str] = []
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self._readers = [
            threading.Thread(target=self._read, args=(self.proc.stdout, self.stdout, False)),
            threading.Thread(target=self._read, args=(self.proc.stderr, self.stderr, True)),
        ]
        for reader in self._readers:
            reader.daemon = True
            reader.start()

    def _read(self, stream: IO[str], lines: list[str], announces: bool) -> None:
        for line in stream:
            lines.append(line)
            if announces:
                print_metrics_url(self.role, line)
        stream.close()

    def last_line(self) -> str:
        for reader in self._readers:
            reader.join()
        lines = [line.strip() for line in self.stderr + self.stdout if line.strip()]
        return lines[-1][:150] if lines else ""


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
    env = child_environment(settings, "operator")
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
    # Its endpoint announced itself before the page did: the line is in the log by now.
    for line in log_path.read_text(errors="replace").splitlines():
        print_metrics_url("operator", line)


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
