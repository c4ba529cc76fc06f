"""Subcommands of the subscription runtime: consume, dead letters (over the operator service, the
same code as the HTTP API and the page), operator controls, ledger."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from consumers.runtime.dead_letters import LetterKind, LetterStatus
from consumers.subscriptions.ledger import read_ledger
from router.cli.common import operator_name, print_json, stop_on_signals
from router.operator.service import OperatorService
from router.settings import Settings
from router.wiring.subscription import (
    controls,
    open_subscription,
    processor_for,
    redis_client,
    tp_of,
)
from streams.clock import SystemClock
from streams.topology import QUEUE_PURPOSES


def consume(settings: Settings, args: argparse.Namespace) -> int:
    stop = stop_on_signals()
    subscription = open_subscription(settings, args.subscription)
    try:
        stats = subscription.runner.run(
            until_idle_s=args.until_idle, should_stop=stop.is_set, tick=subscription.tick
        )
    finally:
        subscription.close()
    print(
        f"{args.subscription}: {stats.records} records, {stats.applied} applied, "
        f"{stats.duplicates} duplicates, {stats.failures} batch failures, "
        f"{stats.dead_lettered} dead-lettered ({stats.poison} poison)",
        file=sys.stderr,
    )
    return 0


def dead_letters_list(settings: Settings, args: argparse.Namespace) -> int:
    service = OperatorService(settings)
    try:
        found = service.list_dead_letters(
            status=args.status,
            kind=args.kind,
            subscription=args.subscription,
            queue=args.queue,
            limit=args.limit,
        )
    finally:
        service.close()
    if args.json:
        print_json([d.model_dump() for d in found.items])
    else:
        for d in found.items:
            print(
                f"{d.id}  {d.status:<9} {d.kind:<12} {d.subscription or d.origin_queue or '-':<24} {d.error[:80]}"
            )
    if found.matched > len(found.items) or found.truncated:
        more = "+" if found.truncated else ""
        print(
            f"(showing {len(found.items)} of {found.matched}{more}, newest first)", file=sys.stderr
        )
    return 0


def dead_letters_show(settings: Settings, args: argparse.Namespace) -> int:
    service = OperatorService(settings)
    try:
        print_json(service.dead_letter(args.id).model_dump())
    finally:
        service.close()
    return 0


def dead_letters_retry(settings: Settings, args: argparse.Namespace) -> int:
    service = OperatorService(settings)
    try:
        result = service.retry(
            args.id, who=operator_name(getattr(args, "who", None)), reason=args.reason
        )
    finally:
        service.close()
    print(f"{args.id}: {result.dead_letter.status}; {result.outcome}")
    return 0


def dead_letters_dismiss(settings: Settings, args: argparse.Namespace) -> int:
    service = OperatorService(settings)
    try:
        result = service.dismiss(
            args.id, who=operator_name(getattr(args, "who", None)), reason=args.reason
        )
    finally:
        service.close()
    print(f"{args.id}: {result.dead_letter.status}; {result.outcome}")
    return 0


def _controls(settings: Settings, args: argparse.Namespace) -> Any:
    client = redis_client(settings)
    clock = SystemClock()
    return controls(
        settings, processor_for(settings, args.subscription, client, clock), client, clock
    )


def re_reduce(settings: Settings, args: argparse.Namespace) -> int:
    projects = _controls(settings, args).re_reduce(
        tp_of(settings, args.topic, args.partition),
        who=operator_name(getattr(args, "who", None)),
        why=args.reason or "operator re-reduce",
    )
    print(
        f"re-reduced {args.topic}[{args.partition}] for {args.subscription}: {projects} projects in the fold"
    )
    return 0


def reprocess_from(settings: Settings, args: argparse.Namespace) -> int:
    progress = _controls(settings, args).reprocess_from(
        tp_of(settings, args.topic, args.partition),
        args.offset,
        args.expected_revision,
        who=operator_name(getattr(args, "who", None)),
        why=args.reason,
    )
    print(
        f"{args.subscription} {args.topic}[{args.partition}] reprocesses from {args.offset} at revision {progress.cursor_revision}"
    )
    return 0


def skip_through(settings: Settings, args: argparse.Namespace) -> int:
    progress = _controls(settings, args).skip_through(
        tp_of(settings, args.topic, args.partition),
        args.offset,
        who=operator_name(getattr(args, "who", None)),
        why=args.reason,
    )
    print(
        f"{args.subscription} {args.topic}[{args.partition}] acknowledged through {progress.acked_through}"
    )
    return 0


def progress(settings: Settings, args: argparse.Namespace) -> int:
    c = _controls(settings, args)
    out = {}
    for topic in settings.topology.stream_names():
        for partition in range(settings.partitions):
            tp = tp_of(settings, topic, partition)
            out[str(tp)] = c.store.load(tp).as_fields()
    print_json(out)
    return 0


def ledger(settings: Settings, args: argparse.Namespace) -> int:
    print_json(read_ledger(redis_client(settings), settings.env))
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("consume", help="run a subscription (one process of its consumer group)")
    p.add_argument(
        "--subscription",
        required=True,
        help="project-view-projector, causal-router, audit-archiver or analytics-projector (the "
        "product's four); ledger is the runtime's drill and test subscription",
    )
    p.add_argument(
        "--until-idle",
        type=float,
        metavar="SECONDS",
        help="exit once nothing was consumed, paused for retry or in flight for this long",
    )
    p.set_defaults(handler=consume)

    dl = sub.add_parser(
        "dead-letters", help="list, show, retry or dismiss dead letters"
    ).add_subparsers(dest="action", required=True)
    p = dl.add_parser("list", help="dead letters of every kind, newest first")
    p.add_argument("--json", action="store_true")
    p.add_argument("--status", choices=[s.value for s in LetterStatus])
    p.add_argument("--kind", choices=[k.value for k in LetterKind])
    p.add_argument("--subscription", help="only letters of this subscription")
    p.add_argument("--queue", choices=QUEUE_PURPOSES, help="only commands from this queue")
    p.add_argument("--limit", type=int, help="at most this many (default: operator_page_size)")
    p.set_defaults(handler=dead_letters_list)
    p = dl.add_parser("show")
    p.add_argument("id")
    p.set_defaults(handler=dead_letters_show)
    p = dl.add_parser("retry")
    p.add_argument("id")
    p.add_argument("--who")
    p.add_argument("--reason")
    p.set_defaults(handler=dead_letters_retry)
    p = dl.add_parser("dismiss")
    p.add_argument("id")
    p.add_argument("--reason", required=True)
    p.add_argument("--who")
    p.set_defaults(handler=dead_letters_dismiss)

    ctl = sub.add_parser(
        "subscription", help="operator controls per topic-partition (audited)"
    ).add_subparsers(dest="action", required=True)
    for name, handler, extra in (
        ("re-reduce", re_reduce, ()),
        ("reprocess-from", reprocess_from, ("offset", "expected-revision")),
        ("skip-through", skip_through, ("offset",)),
        ("progress", progress, ()),
    ):
        p = ctl.add_parser(name)
        p.add_argument("--subscription", required=True)
        if name != "progress":
            p.add_argument("--topic", required=True)
            p.add_argument("--partition", type=int, required=True)
            p.add_argument("--who")
            p.add_argument("--reason", required=name in ("skip-through", "reprocess-from"))
        for arg in extra:
            p.add_argument(f"--{arg}", type=int, required=True)
        p.set_defaults(handler=handler)

    p = sub.add_parser("ledger", help="what the ledger subscription applied, per project in order")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=ledger)
