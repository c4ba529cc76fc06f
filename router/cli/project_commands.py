"""``rhumbatron projects list [--json]``: the projects of the environment, from the views
``project-view-projector`` keeps in Redis (one row each: where its events are, how many were
applied, its highest slot, a gap, its last event's time)."""

from __future__ import annotations

import argparse
from typing import Any

from consumers.subscriptions.projector.view import list_views
from router.cli.common import print_json
from router.settings import Settings
from router.wiring.subscription import redis_client

# The fields of a view the list shows (the whole view: rhumbatron view PROJECT_ID).
FIELDS = ("projectId", "stream", "partition", "events", "highSlot", "gap", "lastEventTime")
HEADERS = ("PROJECT", "STREAM[PARTITION]", "EVENTS APPLIED", "HIGH SLOT", "GAP", "LAST EVENT")


def projects_list(settings: Settings, args: argparse.Namespace) -> int:
    views = [{k: v[k] for k in FIELDS} for v in list_views(redis_client(settings), settings.env)]
    if args.json:
        print_json(views)
        return 0
    if not views:
        print(
            f"no projects: project-view-projector has built no view in '{settings.env}' "
            "(run rhumbatron consume --subscription project-view-projector)"
        )
        return 0
    rows = [_row(v) for v in views]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(HEADERS)]
    for row in (HEADERS, *rows):
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    gaps = sum(1 for v in views if v["gap"])
    print(
        f"{len(views)} projects, {sum(v['events'] for v in views)} events applied; "
        f"{gaps} with a gap in their slots"
    )
    return 0


def _row(v: dict[str, Any]) -> tuple[str, ...]:
    return (
        v["projectId"],
        f"{v['stream']}[{v['partition']}]",
        str(v["events"]),
        "-" if v["highSlot"] is None else str(v["highSlot"]),
        "yes" if v["gap"] else "no",
        v["lastEventTime"] or "-",
    )


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    projects = sub.add_parser(
        "projects", help="the environment's projects, from the project views"
    ).add_subparsers(dest="action", required=True)
    p = projects.add_parser(
        "list",
        help="every project with a view: events applied, high slot, gap, last event time",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(handler=projects_list)
