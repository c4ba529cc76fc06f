"""Subcommands of the command workers: ``worker``, ``dead-letter-consumer``, ``worker-stats``."""

from __future__ import annotations

import argparse
import sys
import threading

import orjson

from router.cli.common import non_negative_float, stop_on_signals
from router.settings import Settings
from router.wiring.subscription import redis_client
from router.wiring.workers import (
    WorkerProcess,
    open_dead_letter_consumer,
    open_worker,
    worker_figures,
)
from router.workers.drills import HANDLERS
from streams.errors import ConfigurationError
from streams.topology import QUEUE_PURPOSES


def _run(process: WorkerProcess, name: str, until_idle: float | None, stop: threading.Event) -> int:
    try:
        stats = process.worker.run(
            until_idle_s=until_idle, should_stop=stop.is_set, tick=process.tick
        )
    finally:
        process.close()
    summary = stats.as_dict()
    parts = ", ".join(f"{v} {k}" for k, v in summary.items())
    print(f"{name}: {parts}", file=sys.stderr)
    sys.stdout.write(orjson.dumps(summary).decode() + "\n")
    return 0


def worker(settings: Settings, args: argparse.Namespace) -> int:
    name = args.handler_name
    if name not in HANDLERS:
        raise ConfigurationError(
            f"unknown handler {name!r}; built-in handlers: {', '.join(sorted(HANDLERS))}"
        )
    stop = stop_on_signals()
    client = redis_client(settings)
    handler = HANDLERS[name](client, settings.env, args.queue)
    process = open_worker(settings, args.queue, handler, client=client)
    return _run(process, f"worker {args.queue} ({name})", args.until_idle, stop)


def dead_letter_consumer(settings: Settings, args: argparse.Namespace) -> int:
    stop = stop_on_signals()
    process = open_dead_letter_consumer(settings)
    return _run(process, "dead-letter-consumer", args.until_idle, stop)


def worker_stats(settings: Settings, args: argparse.Namespace) -> int:
    # JSON with or without --json: the figures are nested maps that a table would flatten.
    figures = worker_figures(settings, redis_client(settings))
    sys.stdout.write(orjson.dumps(figures, option=orjson.OPT_INDENT_2).decode() + "\n")
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "worker",
        help="run a command worker on one queue with a built-in handler (drills, demo, bench)",
    )
    p.add_argument("--queue", required=True, choices=QUEUE_PURPOSES, help="the queue's purpose")
    p.add_argument(
        "--handler",
        dest="handler_name",
        required=True,
        help=f"one of: {', '.join(sorted(HANDLERS))}",
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
