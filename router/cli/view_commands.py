"""Subcommands reading the project views: ``view PROJECT_ID [--json]`` and ``feed PROJECT_ID
[--json]``. The project's partition comes from the topology, the keys from the projector."""

from __future__ import annotations

import argparse
from typing import Any

from consumers.runtime.types import TP
from consumers.subscriptions.projector.view import read_feed, read_view
from router.cli.common import print_json
from router.settings import Settings
from router.wiring.subscription import redis_client


def project_tp(settings: Settings, project_id: str) -> TP:
    topic, partition = settings.topology.partition_of(project_id)
    return TP(topic, partition)


def view(settings: Settings, args: argparse.Namespace) -> int:
    data = read_view(
        redis_client(settings), settings.env, project_tp(settings, args.project_id), args.project_id
    )
    if args.json:
        print_json(data)
    else:
        _print_view(data)
    return 0


def _print_view(v: dict[str, Any]) -> None:
    print(f"project {v['projectId']} ({v['stream']}[{v['partition']}]): {v['events']} events")
    print(f"  last event  {v['lastEventTime']}")
    print(f"  generation  {v['generation'] if v['generation'] is not None else '-'}")
    slots = f"  high slot   {v['highSlot'] if v['highSlot'] is not None else '-'}"
    if v["gap"]:
        missing = ", ".join(str(s) for s in v["missingSlots"])
        more = " (and more: overflow)" if v["missingOverflow"] else ""
        slots += f"; GAP, missing {missing}{more}"
    print(slots + f"; gaps recorded {v['gapsRecorded']}")
    agents = ", ".join(f"{a} ({n})" for a, n in v["activeAgents"].items()) or "-"
    print(f"  active agents  {agents}")
    print("  counts")
    for etype, n in v["counts"].items():
        print(f"    {etype:<28} {n}")
    print("  changes")
    for change, state in v["changes"].items():
        print(f"    {change:<40} {state}")
    print("  tasks")
    for task, t in v["tasks"].items():
        print(f"    {task:<40} {t['state']:<10} {t['agent'] or '-'}")


def feed(settings: Settings, args: argparse.Namespace) -> int:
    entries = read_feed(
        redis_client(settings), settings.env, project_tp(settings, args.project_id), args.project_id
    )
    if args.json:
        print_json(entries)
        return 0
    if not entries:
        print(f"no events in the feed of project {args.project_id}")
    for e in entries:
        slot = str(e.get("slot", "-"))
        subject = e.get("taskId") or e.get("changeId") or ""
        print(f"{slot:>6}  {e['time']}  {e['eventType']:<24} {e['eventId']}  {subject}")
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("view", help="a project's view (kept by project-view-projector)")
    p.add_argument("project_id", metavar="PROJECT_ID", help="the project")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler=view)
    p = sub.add_parser("feed", help="a project's recent events, newest first")
    p.add_argument("project_id", metavar="PROJECT_ID", help="the project")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler=feed)
