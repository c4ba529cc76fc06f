"""``rhumbatron state``: the state Redis holds. ``rebuild-index``: the operator state (the
dead-letter index with each letter's status and audit, the audit logs), rebuilt from its durable
copy on the audit topic (docs/reliability.md: What survives Redis loss). ``migrate``: the state
layout of the subscriptions' keys, and ``--finalize`` to move it forward (docs/operations.md:
Upgrades)."""

from __future__ import annotations

import argparse
import sys
import threading
from dataclasses import asdict

from consumers.runtime import layout
from router.cli.common import print_json
from router.cli.progress import ProgressReporter, start_line
from router.settings import Settings
from router.wiring.provisioning import require_topics
from router.wiring.state import rebuild_state
from router.wiring.subscription import redis_client
from streams.topology import audit_topic


def rebuild_index(settings: Settings, args: argparse.Namespace) -> int:
    topic = audit_topic(settings.env)
    require_topics(settings, [topic])
    start_line("state rebuild-index", settings, topics=[topic])
    read = [0, 0]
    lock = threading.Lock()

    def progress(done: int, total: int) -> None:
        with lock:
            read[:] = [done, total]

    def sample() -> str:
        with lock:
            done, total = read
        return f"rebuild-index: {done} of {total} records read"

    client = redis_client(settings)
    try:
        with ProgressReporter(sample, settings.progress_interval_s):
            report = rebuild_state(settings, client, progress)
    finally:
        client.close()
    if args.json:
        print_json(asdict(report))
    else:
        print(f"rebuilt from {topic}: {report.summary()}")
    return 0


def migrate(settings: Settings, args: argparse.Namespace) -> int:
    client = redis_client(settings)
    try:
        if args.finalize:
            if layout.LAYOUT < 2 or not layout.WRITES_SLOT_CLAIMS:
                print(
                    f"rhumbatron: this release speaks state layout {layout.LAYOUT} and does not "
                    "write the next one: finalize with a release that does (rhumbatron "
                    "--version shows the layout a release speaks)",
                    file=sys.stderr,
                )
                return 2
            moved = layout.finalize(client, settings.env)
        found = layout.layouts(client, settings.env)
        target = int(client.get(layout.environment_key(settings.env)) or 1)
    finally:
        client.close()
    figures = {
        "env": settings.env,
        "speaks": layout.LAYOUT,
        "writes_slot_claims": layout.WRITES_SLOT_CLAIMS,
        "finalized_layout": target,
        "partitions_by_layout": {str(k): v for k, v in sorted(found.items())},
        **({"moved": moved} if args.finalize else {}),
    }
    if args.json:
        print_json(figures)
        return 0
    spread = ", ".join(f"{v} in layout {k}" for k, v in sorted(found.items())) or "none yet"
    print(f"environment {settings.env}: partitions {spread}; finalized to layout {target}")
    if args.finalize:
        print(
            f"finalized: {moved} partitions moved to layout {layout.LAYOUT}; from now on only "
            "it is written, and releases that do not speak it refuse to write"
        )
    elif target < layout.LAYOUT:
        print(
            f"this release speaks layout {layout.LAYOUT} and writes both; once every process "
            "runs it, `rhumbatron state migrate --finalize` stops the old writes (no rollback "
            "past it)"
        )
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    state = sub.add_parser(
        "state",
        help="the state in Redis: the operator state (dead-letter index, audit logs) and the "
        "subscriptions' state layout",
    )
    commands = state.add_subparsers(dest="state_command", required=True)
    p = commands.add_parser(
        "rebuild-index",
        help="write into Redis what it lacks of the dead-letter index and the audit logs, from "
        "the audit topic (idempotent; a process owning the index does it at its start when "
        "Redis came back empty)",
    )
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.set_defaults(handler=rebuild_index)
    p = commands.add_parser(
        "migrate",
        help="the subscriptions' state layout: which layout each partition is in; with "
        "--finalize, move every partition to this release's (no rollback past it)",
    )
    p.add_argument(
        "--finalize",
        action="store_true",
        help="stop writing the older layout: every partition, and those made later, move to "
        "this release's layout; releases that do not speak it refuse to write",
    )
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.set_defaults(handler=migrate)
