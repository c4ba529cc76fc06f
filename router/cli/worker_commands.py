"""Subcommands of the command workers: ``worker``, ``dead-letter-consumer``, ``worker-stats``."""

from __future__ import annotations

import argparse
import sys
import threading
from collections import Counter

import orjson
from pydantic import SecretStr

from router.cli.common import QUEUE_HELP, known_queue, non_negative_float, stop_on_signals
from router.cli.observed import observed
from router.cli.progress import (
    LagProbe,
    ProgressReporter,
    group_topics,
    start_line,
)
from router.settings import Settings, worker_target
from router.wiring.commands import CommandSender, new_command
from router.wiring.probes import ProcessHealth
from router.wiring.subscription import redis_client
from router.wiring.workers import (
    DEAD_LETTER_QUEUE,
    WorkerProcess,
    http_handler,
    open_dead_letter_consumer,
    open_worker,
    serve_worker,
    worker_figures,
    worker_slug,
)
from router.workers.handlers import load_handler
from router.workers.model import CommandHandler
from router.workers.worker import WorkerStats


def _run(
    settings: Settings,
    process: WorkerProcess,
    name: str,
    purpose: str,
    until_idle: float | None,
    stop: threading.Event,
    health: ProcessHealth,
) -> int:
    reads = settings.topology.worker_reads(worker_slug(purpose), purpose)
    start_line(name, settings, group=reads.group, topics=group_topics(reads))
    stats = process.worker.stats
    lag = LagProbe(settings, reads)

    def sample() -> str:
        return f"{name}: {stats.records} records, {_outcomes(stats.outcomes)}, lag {lag()}"

    with ProgressReporter(sample, settings.progress_interval_s):
        stats = serve_worker(
            process, until_idle_s=until_idle, should_stop=stop.is_set, health=health
        )
    print(worker_summary(name, stats), file=sys.stderr)
    sys.stdout.write(orjson.dumps(stats.as_dict()).decode() + "\n")
    return 0


# What each outcome the worker counts means, for its summary.
OUTCOMES = {
    "ok": "ran and succeeded",
    "retried": "failed, sent to the retry topic",
    "dead_lettered": "failed their last attempt, sent to the dead-letter queue",
    "expired": "past their deadline, sent to the dead-letter queue",
    "exhausted_recorded": "failed their last attempt, recorded by the handler",
    "expired_recorded": "past their deadline, recorded by the handler",
    "duplicate": "already done, skipped",
    "more_work_last_delivery": "asked for more work on their last delivery, acknowledged",
    "undecodable": "not a command, sent to the dead-letter queue",
    "undecodable_recorded": "not a command, recorded by the handler",
    "dropped": "given up with no dead-letter queue (logged)",
}


def _outcomes(outcomes: Counter[str]) -> str:
    return ", ".join(f"{n} {k}" for k, n in sorted(outcomes.items())) or "nothing settled"


def worker_summary(name: str, stats: WorkerStats) -> str:
    explained = "; ".join(
        f"{n} {OUTCOMES.get(k, k)}" for k, n in sorted(stats.outcomes.items()) if k != "failed"
    )
    return (
        f"{name}: {stats.records} records settled: {explained or 'none'} "
        f"({stats.outcomes['failed']} attempts failed in the handler); {stats.transactions} "
        f"transactions ({stats.transaction_failures} failed)"
    )


def queue_secrets(settings: Settings, args: argparse.Namespace) -> SecretStr | None:
    """The queue's own signing secrets, where ``fleet_workers`` gives its workers this URL and
    secrets of their own (a deployment's pods read them from the config, as the fleet does)."""
    given = settings.fleet_workers.get(args.queue)
    if given is None:
        return None
    target = worker_target(given)
    return target.http_secrets if target.http == args.http else None


def worker(settings: Settings, args: argparse.Namespace) -> int:
    # A wrong queue or handler is one line and exit 2, before anything starts.
    known_queue(settings.topology, args.queue)
    posting = None
    if args.http is not None:
        name = args.http
        posting = http_handler(settings, args.http, queue_secrets(settings, args))
        handler: CommandHandler = posting
    else:
        name = args.handler_name
        handler = load_handler(name)
    stop = stop_on_signals()
    with observed(settings, f"worker-{args.queue}") as health:
        if posting is not None:
            posting.measure(args.queue)
        client = redis_client(settings)
        process = open_worker(settings, args.queue, handler, client=client)
        label = f"worker {args.queue} ({name})"
        return _run(settings, process, label, args.queue, args.until_idle, stop, health)


def dead_letter_consumer(settings: Settings, args: argparse.Namespace) -> int:
    stop = stop_on_signals()
    with observed(settings, "dead-letter-consumer") as health:
        process = open_dead_letter_consumer(settings)
        label = "dead-letter-consumer"
        return _run(settings, process, label, DEAD_LETTER_QUEUE, args.until_idle, stop, health)


def worker_stats(settings: Settings, args: argparse.Namespace) -> int:
    # JSON with or without --json: the figures are nested maps that a table would flatten.
    figures = worker_figures(settings, redis_client(settings))
    sys.stdout.write(orjson.dumps(figures, option=orjson.OPT_INDENT_2).decode() + "\n")
    return 0


def _payload(text: str) -> dict[str, object]:
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON ({exc})") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object, got {type(value).__name__}")
    return value


def command_send(settings: Settings, args: argparse.Namespace) -> int:
    command = new_command(
        args.type,
        args.project,
        payload=args.payload,
        command_id=args.id,
        change_id=args.change,
        task_id=args.task,
        deadline_s=args.deadline_s,
    )
    topic = CommandSender(settings).send(command, known_queue(settings.topology, args.queue))
    if args.json:
        sys.stdout.write(orjson.dumps({"command_id": command.command_id, "topic": topic}).decode())
        sys.stdout.write("\n")
    else:
        print(f"sent {command.command_id} ({command.command_type}) to {topic}")
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    cmd = sub.add_parser(
        "command", help="send a command to a queue, as a service would"
    ).add_subparsers(dest="action", required=True)
    p = cmd.add_parser(
        "send",
        help="send one command (idempotent on --id: the same id again is a duplicate)",
        description="Sends one command to its queue (by default the queue of its type in the "
        "catalog) and waits for Kafka's acknowledgement. Give --id to make a re-send a "
        "duplicate its worker skips; without it a random id is given.",
    )
    p.add_argument("--type", required=True, help="the command type, e.g. index.build")
    p.add_argument("--project", required=True, help="the project it is for (its partition key)")
    p.add_argument(
        "--queue", default=None, help=f"the queue ({QUEUE_HELP}); default: the type's queue"
    )
    p.add_argument("--payload", type=_payload, default=None, help="a JSON object")
    p.add_argument("--id", default=None, help="the command id, cmd_…; default: a random one")
    p.add_argument("--change", default=None, help="the change id it belongs to")
    p.add_argument("--task", default=None, help="the task id it belongs to")
    p.add_argument(
        "--deadline-s",
        type=non_negative_float,
        default=None,
        metavar="SECONDS",
        help="not run past this many seconds from now (dead-lettered as expired)",
    )
    p.add_argument("--json", action="store_true", help="print the id and topic as JSON")
    p.set_defaults(handler=command_send)

    p = sub.add_parser(
        "worker",
        help="run a command worker on one queue with your handler (or a built-in drill)",
        description="Runs a command worker: it reads the queue and its retry topics and runs "
        "the handler on each command, with retries, dead letters and exact attempts "
        "(docs/handlers.md). The handler is your code, named as package.module:attr (a "
        "function handler(command, ctx), plain or async, a Handlers registry, or a "
        "QueueHandler subclass) or by the name it is installed under in the entry-point group "
        "rhumbatron.handlers. Built-in: ok, drill, flaky (drills, the demo and the benchmark). "
        "A service in any language: --http URL.",
    )
    p.add_argument("--queue", required=True, help="the queue: " + QUEUE_HELP)
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument(
        "--handler",
        dest="handler_name",
        metavar="PACKAGE.MODULE:ATTR|NAME",
        help="your handler as package.module:attr, or an installed handler's name "
        "(entry points rhumbatron.handlers; built-in: ok, drill, flaky)",
    )
    target.add_argument(
        "--http",
        metavar="URL",
        help="POST each command to this service, signed with RHUMBATRON_HTTP_HANDLER_SECRETS "
        "(the HTTP contract: docs/handlers.md)",
    )
    p.add_argument(
        "--until-idle",
        type=non_negative_float,
        default=None,
        metavar="SECONDS",
        help="exit once nothing was consumed or in flight for this long",
    )
    p.set_defaults(handler=worker)

    p = sub.add_parser(
        "dead-letter-consumer",
        help="record dead-lettered commands, block their tasks through the router's outbox",
    )
    p.add_argument(
        "--until-idle",
        type=non_negative_float,
        default=None,
        metavar="SECONDS",
        help="exit once nothing was consumed or in flight for this long",
    )
    p.set_defaults(handler=dead_letter_consumer)

    p = sub.add_parser("worker-stats", help="the workers' counters and command dead letters")
    p.add_argument("--json", action="store_true", help="print JSON (this command always does)")
    p.set_defaults(handler=worker_stats)
