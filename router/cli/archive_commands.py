"""``rhumbatron archive``: expire old parts, verify a day's parts, count parts."""

from __future__ import annotations

import argparse
import sys

from consumers.subscriptions.archive.format import parse_day
from consumers.subscriptions.archive.ops import Progress, expire, verify_day
from router.cli.common import print_json
from router.settings import Settings
from router.wiring.archive import count_parts, object_store, retention_days, stream_indexes
from streams.clock import SystemClock


def progress_printer(label: str, step_pct: int) -> Progress:
    """Print ``label: done/total parts (pct%)`` on stderr each time another ``step_pct`` percent
    is done, and at the end."""
    shown = {"pct": -1}

    def show(done: int, total: int) -> None:
        pct = 100 if total == 0 else done * 100 // total
        if done == total or pct >= shown["pct"] + step_pct:
            shown["pct"] = pct
            print(f"{label}: {done}/{total} parts ({pct}%)", file=sys.stderr, flush=True)

    return show


def archive_expire(settings: Settings, args: argparse.Namespace) -> int:
    days = retention_days(settings)
    objects = object_store(settings)
    report = expire(
        objects,
        today=SystemClock().now().date(),
        retention_days=days,
        dry_run=args.dry_run,
        progress=progress_printer(
            "expire (dry run)" if args.dry_run else "expire", settings.archive_progress_step_pct
        ),
    )
    if args.json:
        print_json({**report.to_json(), "retention_days": days, "env": settings.env})
    else:
        verb = "would delete" if args.dry_run else "deleted"
        print(
            f"archive of {settings.env} ({objects.describe()}), retention {days} days: {verb} "
            f"{report.parts} parts of {len(report.days)} days before {report.cutoff} and "
            f"{report.index_entries} index entries; {report.kept} parts kept"
        )
    for key in report.unrecognised:
        print(f"archive: left {key!r}: not an archive part key", file=sys.stderr)
    return 0


def archive_verify(settings: Settings, args: argparse.Namespace) -> int:
    day = parse_day(args.day)
    report = verify_day(
        object_store(settings),
        day,
        max_envelope_bytes=settings.max_envelope_bytes,
        streams=stream_indexes(settings),
        progress=progress_printer("verify", settings.archive_progress_step_pct),
    )
    if args.json:
        print_json(report.to_json())
    else:
        print(
            f"archive {report.day}: {report.parts} good parts, {report.events} events, "
            f"{report.duplicates} duplicate events, {len(report.bad)} bad parts"
        )
        for bad in report.bad:
            print(f"  BAD {bad.key}: {bad.reason}")
    return 0 if report.ok else 1


def archive_count(settings: Settings, args: argparse.Namespace) -> int:
    day = parse_day(args.day) if args.day else None
    parts = count_parts(settings, day)
    if args.json:
        print_json({"parts": parts, "day": day.isoformat() if day else None})
    else:
        print(parts)
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    archive = sub.add_parser(
        "archive", help="the audit archive: expire old parts, verify a day, count parts"
    ).add_subparsers(dest="action", required=True)
    p = archive.add_parser(
        "expire",
        help="delete parts older than the environment's retention (30 days dev, 365 prod)",
    )
    p.add_argument("--dry-run", action="store_true", help="say what would go; delete nothing")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(handler=archive_expire)
    p = archive.add_parser(
        "verify", help="read every part of a day back and check it against its key's hash"
    )
    p.add_argument("--day", required=True, metavar="YYYY-MM-DD", help="the day to verify")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(handler=archive_verify)
    p = archive.add_parser("count", help="number of parts (of one day, or all)")
    p.add_argument("--day", metavar="YYYY-MM-DD", help="only this day's parts (default: all)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler=archive_count)
