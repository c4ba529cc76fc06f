"""``rhumbatron state``: the operator state Redis holds (the dead-letter index with each letter's
status and audit, the audit logs), rebuilt from its durable copy on the audit topic
(docs/reliability.md: What survives Redis loss)."""

from __future__ import annotations

import argparse
import threading
from dataclasses import asdict

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


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    state = sub.add_parser(
        "state", help="the operator state in Redis (dead-letter index, audit logs)"
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
