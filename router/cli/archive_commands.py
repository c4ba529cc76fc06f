"""``rhumbatron archive``: expire old parts, verify a day's parts, count parts."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from consumers.subscriptions.archive.format import parse_day
from consumers.subscriptions.archive.ops import Progress, day_prefix, expire, verify_day
from consumers.subscriptions.archive.store import LocalObjectStore, ObjectStore
from router.cli.common import print_json
from router.cli.progress import start_line
from router.settings import Settings
from router.wiring.archive import count_parts, object_store, retention_days, stream_indexes
from streams.clock import SystemClock


def progress_printer(
    label: str, step_pct: int, *, first: Callable[[], object] = lambda: None
) -> Progress:
    """Print ``label: done/total parts (pct%)`` on stderr each time another ``step_pct`` percent
    is done, and at the end; ``first()`` runs before the first line (the sweep's start line,
    said once the store has answered, so a store that fails says only its error)."""
    shown = {"pct": -1}

    def show(done: int, total: int) -> None:
        if shown["pct"] < 0:
            first()
        pct = 100 if total == 0 else done * 100 // total
        if done == total or pct >= shown["pct"] + step_pct:
            shown["pct"] = pct
            print(f"{label}: {done}/{total} parts ({pct}%)", file=sys.stderr, flush=True)

    return show


def _where(objects: ObjectStore) -> str:
    """The store for messages; a local one as an absolute path, since a relative archive_dir
    depends on the folder the command runs from."""
    if isinstance(objects, LocalObjectStore):
        return f"directory {objects.root.resolve()}"
    return objects.describe()


def _setting_of(settings: Settings) -> str:
    if settings.archive_store == "local":
        return (
            "archive_dir (RHUMBATRON_ARCHIVE_DIR; a relative one is read from the current folder)"
        )
    return "archive_s3_bucket and archive_s3_prefix (RHUMBATRON_ARCHIVE_S3_BUCKET, _PREFIX)"


def archive_expire(settings: Settings, args: argparse.Namespace) -> int:
    days = retention_days(settings)
    objects = object_store(settings)
    report = expire(
        objects,
        today=SystemClock().now().date(),
        retention_days=days,
        dry_run=args.dry_run,
        progress=progress_printer(
            "expire (dry run)" if args.dry_run else "expire",
            settings.archive_progress_step_pct,
            first=lambda: start_line(f"archive expire in {_where(objects)}", settings),
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
    objects = object_store(settings)
    report = verify_day(
        objects,
        day,
        max_envelope_bytes=settings.max_envelope_bytes,
        streams=stream_indexes(settings),
        progress=progress_printer(
            "verify",
            settings.archive_progress_step_pct,
            first=lambda: start_line(f"archive verify {day} in {_where(objects)}", settings),
        ),
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
    if report.empty:
        print(
            f"rhumbatron: no archive parts for {report.day} in {_where(objects)} "
            f"(keys {day_prefix(day)}*), so nothing was verified; check the day, the environment "
            f"('{settings.env}') and {_setting_of(settings)}",
            file=sys.stderr,
        )
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
