"""The outbox's commands: ``publish``, ``outbox init|migrate|stats|retry|skip|purge``, and ``produce --outbox``
(the synthetic workload written through the outbox by concurrent writers). The outbox and its
publisher are built from settings in router/wiring/outbox.py."""

from __future__ import annotations

import argparse
import logging
import secrets
import signal
import sys
import threading
import time
from types import FrameType

from router.cli.common import operator_name, parse_duration, print_json
from router.cli.observed import observed
from router.cli.progress import ProgressReporter, say, start_line
from router.settings import Settings
from router.wiring.outbox import (
    build_publisher,
    init_postgres_outbox,
    migrate_postgres_outbox,
    open_outbox,
)
from router.wiring.provisioning import compact_names, missing_topics
from streams.errors import NotProvisioned, PublisherLocked, Unreachable
from streams.headers import OUTBOX
from streams.outbox import ops
from streams.outbox.publisher import Publisher, PublisherTotals
from streams.outbox.standby import PublisherRole, Tick, take_over
from streams.outbox.store import OutboxStore, RowState, is_postgres_url
from streams.workload import workload, write_workload

TENANT = "tenant-demo"

log = logging.getLogger("rhumbatron.outbox.publisher")


def produce_to_outbox(settings: Settings, args: argparse.Namespace) -> int:
    """``rhumbatron produce --outbox PATH``: the synthetic workload, written by concurrent
    writers; ``rhumbatron publish --outbox PATH`` sends it."""
    run = args.run or secrets.token_hex(4)
    store = open_outbox(settings, args.outbox, create=True)
    try:
        report = write_workload(
            store,
            workload(run, args.projects, args.events),
            writers=settings.produce_writers,
            events_per_write=settings.produce_events_per_write,
        )
    finally:
        store.close()
    result = {
        "run": run,
        "outbox": store.location,
        "projects": args.projects,
        "events": report.events,
        "duplicates": report.duplicates,
        "writes": report.writes,
        "writers": report.writers,
        "seconds": round(report.seconds, 3),
    }
    if args.json:
        print_json(result)
    else:
        print(
            f"wrote {report.events} events over {args.projects} projects (run {run}) to the outbox "
            f"{store.location}: {report.writes} transactions by {report.writers} writers in "
            f"{report.seconds:.2f}s; now run: rhumbatron publish --outbox {store.location}"
        )
    return 0


# -- publish -----------------------------------------------------------------------------------------
def _check_streams(settings: Settings) -> list[str]:
    """Refuse to start, creating nothing, when Kafka answers but none of the environment's
    streams exist (not provisioned, or a mistyped environment). Returns the streams missing of
    an environment that has some: their rows fail at once with a reason naming the stream, while
    every other project's rows flow. If Kafka does not answer, start anyway: rows wait in
    retry_wait until it does."""
    streams = settings.topology.stream_names()
    try:
        missing = missing_topics(settings, streams)
    except Unreachable:  # the publisher's outage handling takes over
        return []
    if len(missing) == len(streams):
        raise NotProvisioned(settings.env, missing, compact_names(missing))
    return missing


def _progress_line(store: OutboxStore, totals: PublisherTotals) -> str:
    counts = store.counts()
    elapsed = max(time.monotonic() - totals.started, 1e-9)
    return (
        f"publish: {totals.published} published ({totals.published / elapsed:.0f}/s), "
        f"{totals.retries} retries, {totals.failed} failed; outbox: "
        + ", ".join(f"{state.value} {n}" for state, n in counts.items())
    )


class _Term:
    """One term of this process as the outbox's publisher (from taking the lease until it stops
    or loses it): its progress lines, and the start line said once per process."""

    def __init__(self, settings: Settings, store: OutboxStore, missing: list[str]) -> None:
        self.settings = settings
        self.store = store
        self.missing = missing
        self.started = False

    def run(
        self, publisher: Publisher, *, until_empty: bool, stop: threading.Event, beat: Tick
    ) -> PublisherTotals:
        settings = self.settings
        if not self.started:
            # Said once the outbox's lock is held: a refusal before stays the one line it is.
            start_line(
                f"publish {self.store.location}", settings, topics=settings.topology.stream_names()
            )
            if self.missing:
                say(
                    f"publish: warning: {compact_names(self.missing)} missing; rows of its "
                    "projects fail until `rhumbatron provision` makes it and they are retried"
                )
            self.started = True
        last: list[tuple[int, int, int]] = []
        reporter = ProgressReporter(None, settings.progress_interval_s)

        def progress(totals: PublisherTotals) -> None:
            # A line when something moved since the last one: an idle publisher stays quiet.
            now = (totals.published, totals.retries, totals.failed)
            if last and last[0] == now:
                return
            last[:] = [now]
            reporter.show(_progress_line(self.store, totals))

        with reporter:
            return publisher.run(
                until_empty=until_empty,
                stop=stop,
                progress=progress,
                progress_interval_s=settings.progress_interval_s,
                tick=beat,
            )


def publish(settings: Settings, args: argparse.Namespace) -> int:
    """``rhumbatron publish --outbox ADDRESS``: send the outbox's rows until stopped. One
    publisher per outbox publishes (it holds the outbox's publisher lease); one started while
    another holds the lease stands by, ready, and takes over once the holder goes. A one-shot
    publish (``--until-empty``), or ``--no-standby``, refuses at once instead (PublisherLocked,
    exit 2): waiting for the lease would hang a script."""
    store = open_outbox(settings, args.outbox, create=False)
    missing = _check_streams(settings)
    stop = threading.Event()
    stands_by = not (args.until_empty or args.no_standby)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    totals = PublisherTotals()
    term = _Term(settings, store, missing)
    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        with (
            observed(settings, "publisher", needs=("kafka",)) as health,
            PublisherRole(store.location) as role,
        ):

            def standing_by(exc: PublisherLocked) -> None:
                role.standby()
                health.ready = True  # standing by is this process's work until the lease frees
                log.warning(
                    "publish %s: standing by: %s; trying the lease again every %gs "
                    "(publisher_standby_poll_s)",
                    store.location,
                    exc.held_by,
                    settings.publisher_standby_poll_s,
                )

            while not stop.is_set():
                publisher = (
                    take_over(
                        lambda: build_publisher(settings, store),
                        poll_s=settings.publisher_standby_poll_s,
                        stop=stop,
                        beat_s=settings.health_stale_s / 4,
                        tick=health.beat,
                        held=standing_by,
                    )
                    if stands_by
                    else build_publisher(settings, store)
                )
                if publisher is None:
                    break  # stopped while standing by
                with publisher:
                    role.active()
                    health.ready = True  # the outbox's lock is held: this is the one publisher
                    try:
                        totals = term.run(
                            publisher, until_empty=args.until_empty, stop=stop, beat=health.beat
                        )
                    except PublisherLocked as exc:
                        # A PostgreSQL lease lost with its connection, and taken meanwhile by
                        # another publisher: this one stands by again.
                        if not stands_by:
                            raise
                        log.warning(
                            "publish %s: lost the publisher lease (%s)", store.location, exc.held_by
                        )
                        continue
                break
        stuck = ops.stats(store, now=time.time(), row_limit=settings.outbox_stats_row_limit)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        store.close()
    elapsed = time.monotonic() - totals.started
    summary = {**totals.as_dict(), "seconds": round(elapsed, 3), "outbox": stuck.as_dict()}
    if args.json:
        print_json(summary)
    else:
        print(
            f"published {totals.published} rows in {elapsed:.2f}s "
            f"({totals.published / max(elapsed, 1e-9):.0f} rows/s); {totals.retries} retries, "
            f"{totals.failed} rows failed"
        )
    failed = stuck.counts[RowState.FAILED]
    if args.until_empty and failed:
        print(
            f"rhumbatron: {failed} row(s) failed and hold their projects back; see "
            f"'rhumbatron outbox stats --outbox {store.location}', then retry or skip them",
            file=sys.stderr,
        )
        return 1
    return 0


# -- operator commands -------------------------------------------------------------------------------
def stats(settings: Settings, args: argparse.Namespace) -> int:
    store = open_outbox(settings, args.outbox, create=False)
    try:
        found = ops.stats(store, now=time.time(), row_limit=settings.outbox_stats_row_limit)
    finally:
        store.close()
    shown = found.as_dict()
    if args.json:
        print_json(shown)
        return 0
    print(f"outbox {found.location}")
    print(
        f"  identity {found.outbox_id}"
        if found.outbox_id
        else "  no identity (a PostgreSQL outbox below schema version 3): its events go out "
        f"without the {OUTBOX!r} header; run `rhumbatron outbox migrate --outbox URL`"
    )
    print("  " + ", ".join(f"{state.value} {n}" for state, n in found.counts.items()))
    if found.oldest_pending_age_s is not None:
        print(f"  oldest unpublished row: {found.oldest_pending_age_s:.1f}s old")
    if not shown["failed_rows"]:
        print("  no failed rows")
    for row in shown["failed_rows"]:
        print(
            f"  failed {row['event_id']} ({row['project_id']} slot {row['slot']}): {row['last_error']}"
        )
    for held in found.held_projects:
        print(
            f"  held   {held['project_id']}: slot {held['failed_slot']} failed, "
            f"{held['rows_waiting']} row(s) waiting behind it"
        )
    return 0


def init(settings: Settings, args: argparse.Namespace) -> int:
    """``rhumbatron outbox init --outbox URL``: apply the shipped PostgreSQL schema (on this
    version, only its limits and payload rules are written again; an older version is sent to
    ``outbox migrate``, an unknown one refused, naming both). A SQLite outbox is made on first
    use; init makes it now."""
    if is_postgres_url(args.outbox):
        print(init_postgres_outbox(settings, args.outbox))
        return 0
    store = open_outbox(settings, args.outbox, create=True)
    try:
        print(f"SQLite outbox {store.location} ready; identity {store.outbox_id()}")
    finally:
        store.close()
    return 0


def migrate(settings: Settings, args: argparse.Namespace) -> int:
    """``rhumbatron outbox migrate --outbox URL``: move a PostgreSQL outbox to this release's
    schema version, online; idempotent. A SQLite outbox's checks are its writer's: nothing to
    move."""
    if is_postgres_url(args.outbox):
        print(migrate_postgres_outbox(settings, args.outbox))
        return 0
    store = open_outbox(settings, args.outbox, create=False)
    try:
        print(
            f"SQLite outbox {store.location}: nothing to migrate (its writer checks every event "
            f"before it stores it; opening it made its identity if it had none); identity "
            f"{store.outbox_id()}"
        )
    finally:
        store.close()
    return 0


def retry(settings: Settings, args: argparse.Namespace) -> int:
    store = open_outbox(settings, args.outbox, create=False)
    try:
        row = ops.retry(store, args.event_id, who=operator_name(args.who), now=time.time())
    finally:
        store.close()
    print(
        f"{row.event_id} ({row.project_id} slot {row.slot}) was {row.state.value}; now pending "
        "with its attempts reset"
    )
    return 0


def skip(settings: Settings, args: argparse.Namespace) -> int:
    store = open_outbox(settings, args.outbox, create=False)
    try:
        row = ops.skip(
            store, args.event_id, reason=args.reason, who=operator_name(args.who), now=time.time()
        )
    finally:
        store.close()
    print(
        f"{row.event_id} ({row.project_id} slot {row.slot}) skipped: it will never be sent and "
        f"project {row.project_id} moves on to slot {row.slot + 1}"
    )
    return 0


def purge(settings: Settings, args: argparse.Namespace) -> int:
    older_than = parse_duration(args.published_before, option="--published-before")
    store = open_outbox(settings, args.outbox, create=False)
    try:
        removed = ops.purge(store, older_than_s=older_than, now=time.time())
    finally:
        store.close()
    print(f"purged {removed} row(s) published more than {args.published_before} ago")
    return 0


_OUTBOX = "the outbox: a SQLite file, or a postgresql:// URL"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "publish",
        help="send outbox rows to the streams, in order per project",
        description="Send the outbox's rows to the streams, in order per project. One publisher "
        "per outbox publishes (it holds the outbox's publisher lease); one started while another "
        "holds the lease stands by (ready, not publishing), tries the lease again every "
        "publisher_standby_poll_s and takes over once the holder goes. SIGTERM or SIGINT stops "
        "it (exit 0), publishing or standing by.",
    )
    p.add_argument("--outbox", required=True, metavar="ADDRESS", help=_OUTBOX)
    p.add_argument(
        "--until-empty",
        action="store_true",
        help="exit once nothing is left to send; one-shot, so it never stands by: if another "
        "publisher holds the outbox it exits 2 at once, naming the holder",
    )
    p.add_argument(
        "--no-standby",
        action="store_true",
        help="exit 2 at once, naming the holder, if another publisher holds the outbox "
        "(instead of standing by)",
    )
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(handler=publish)

    outbox = sub.add_parser("outbox", help="inspect and repair an outbox")
    commands = outbox.add_subparsers(dest="outbox_command", required=True)

    p = commands.add_parser("init", help="create the outbox's schema (PostgreSQL; idempotent)")
    p.add_argument("--outbox", required=True, metavar="ADDRESS", help=_OUTBOX)
    p.set_defaults(handler=init)

    p = commands.add_parser(
        "migrate", help="move a PostgreSQL outbox to this release's schema (online; idempotent)"
    )
    p.add_argument("--outbox", required=True, metavar="ADDRESS", help=_OUTBOX)
    p.set_defaults(handler=migrate)

    p = commands.add_parser(
        "stats", help="the outbox's identity, rows by state, oldest unpublished, failed and held"
    )
    p.add_argument("--outbox", required=True, metavar="ADDRESS", help=_OUTBOX)
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler=stats)

    p = commands.add_parser("retry", help="send a failed (or waiting) row again (audited)")
    p.add_argument("event_id", metavar="EVENT_ID", help="the row's event id (outbox stats)")
    p.add_argument("--outbox", required=True, metavar="ADDRESS", help=_OUTBOX)
    p.add_argument("--who", help="operator name for the audit log (default: the login name)")
    p.set_defaults(handler=retry)

    p = commands.add_parser("skip", help="never send a row; its project moves on (audited)")
    p.add_argument("event_id", metavar="EVENT_ID", help="the row's event id (outbox stats)")
    p.add_argument("--reason", required=True, help="why, for the audit log")
    p.add_argument("--outbox", required=True, metavar="ADDRESS", help=_OUTBOX)
    p.add_argument("--who", help="operator name for the audit log (default: the login name)")
    p.set_defaults(handler=skip)

    p = commands.add_parser("purge", help="delete published rows older than a duration")
    p.add_argument(
        "--published-before", required=True, metavar="DURATION", help="e.g. 7d, 12h, 30m"
    )
    p.add_argument("--outbox", required=True, metavar="ADDRESS", help=_OUTBOX)
    p.set_defaults(handler=purge)
