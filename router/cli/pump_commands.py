"""``rhumbatron pump``: the feed pump (docs/pump.md), its checkpoint and the audited skip past a
refused line; ``rhumbatron feed-server``: the reference feed."""

from __future__ import annotations

import argparse
import time
from datetime import UTC, datetime
from pathlib import Path

import redis

from consumers.runtime.controls import RedisAuditLog
from router.cli.common import (
    feed_url,
    non_negative_int,
    operator_name,
    positive_int,
    print_json,
    stop_on_signals,
)
from router.cli.observed import observed
from router.cli.progress import say, start_line
from router.settings import Settings
from router.wiring.provisioning import compact_names, missing_topics, pump_topics
from router.wiring.pump import open_pump, sink
from router.wiring.state import durable_audit
from router.wiring.subscription import redis_client
from streams.envelopes import format_time
from streams.errors import NotProvisioned, PumpError
from streams.pump.identity import Checkpoint, Identity
from streams.pump.kafka import feed_key
from streams.pump.pump import Backoff
from streams.pump.pump import skip_through as skip_through_checkpoint
from streams.pump.reference_server import FeedServer
from streams.topology import pump_checkpoint_topic

AUDIT_SLUG = "pump"  # the audit log of the pump's operator actions: rh:<env>:{audit}:pump


def _attested(args: argparse.Namespace) -> Identity | None:
    given = (args.legacy_corpus_id, args.legacy_lineage)
    if given == (None, None):
        return None
    if None in given:
        raise PumpError("--legacy-corpus-id and --legacy-lineage go together: give both or neither")
    return Identity(args.legacy_corpus_id, args.legacy_lineage)


def _check_topics(settings: Settings) -> None:
    """Refuse to start, creating nothing, unless the streams and the checkpoint topic exist."""
    missing = missing_topics(settings, pump_topics(settings.topology))
    if missing:
        raise NotProvisioned(settings.env, missing, compact_names(missing))


def pump(settings: Settings, args: argparse.Namespace) -> int:
    if args.pump_command is not None:
        return int(args.pump_handler(settings, args))
    if args.feed is None:
        raise PumpError("rhumbatron pump needs --feed URL")
    _check_topics(settings)
    stop = stop_on_signals()
    attested = _attested(args)
    with (
        observed(settings, "pump") as health,
        open_pump(settings, args.feed, attested=attested) as p,
    ):
        health.ready = True  # the sink is open: any older pump of this feed is fenced
        start_line(f"pump {feed_key(args.feed)}", settings, topics=settings.topology.stream_names())
        started = time.monotonic()
        totals = p.run(
            once=args.once,
            stop=stop,
            poll_interval_s=settings.pump_poll_interval_s,
            backoff=Backoff(settings.pump_backoff_s, settings.pump_backoff_max_s),
        )
    elapsed = time.monotonic() - started
    checkpoint = totals.checkpoint
    summary = {
        "feed": feed_key(args.feed),
        "published": totals.published,
        "batches": totals.batches,
        "pages": totals.pages,
        "migrated": totals.migrated,
        "checkpoint": checkpoint.as_dict() if checkpoint is not None else None,
        "seconds": round(elapsed, 3),
    }
    if args.json:
        print_json(summary)
    else:
        at = f"sequence {checkpoint.sequence} ({checkpoint.identity})" if checkpoint else "none"
        print(
            f"pumped {totals.published} events in {totals.batches} batches from "
            f"{totals.pages} pages in {elapsed:.2f}s; checkpoint {at}"
            + ("; the legacy checkpoint was migrated" if totals.migrated else "")
        )
    return 0


def checkpoint(settings: Settings, args: argparse.Namespace) -> int:
    kafka = sink(settings, args.feed)
    try:
        found = kafka.checkpoint()
    finally:
        kafka.close()
    if args.json:
        print_json({"feed": feed_key(args.feed), "checkpoint": found.as_dict() if found else None})
    elif found is None:
        print(f"{feed_key(args.feed)}: no checkpoint in {pump_checkpoint_topic(settings.env)}")
    else:
        print(f"{feed_key(args.feed)}: sequence {found.sequence}, {found.identity}")
    return 0


def _audit(
    settings: Settings,
    client: redis.Redis[bytes],
    args: argparse.Namespace,
    action: str,
    before: Checkpoint,
    **details: object,
) -> None:
    """An operator's move of a feed's checkpoint, in the pump's audit log."""
    # Written after the move (the pump's sink moves and reads in one step): a failed durable
    # write is reported with the move done.
    RedisAuditLog(
        client, env=settings.env, slug=AUDIT_SLUG, durable=durable_audit(settings)
    ).append(
        {
            "action": action,
            "feed": feed_key(args.feed),
            "from": before.sequence,
            **details,
            "corpus_id": before.identity.corpus_id,
            "history_lineage": before.identity.lineage,
            "who": operator_name(args.who),
            "why": args.reason,
            "at": format_time(datetime.now(UTC)),
        }
    )


def skip_through(settings: Settings, args: argparse.Namespace) -> int:
    if not args.reason.strip():
        raise PumpError("skip-through needs a --reason: it is the audited way past a feed line")
    kafka = sink(settings, args.feed)
    client = redis_client(settings)
    try:
        kafka.open()  # a running pump of the feed is fenced before the checkpoint is read
        before, moved = skip_through_checkpoint(kafka, args.sequence)
        _audit(settings, client, args, "skip_through", before, to=moved.sequence)
    finally:
        kafka.close()
        client.close()
    print(f"{feed_key(args.feed)}: checkpoint moved to sequence {moved.sequence} (audited)")
    return 0


def forget(settings: Settings, args: argparse.Namespace) -> int:
    if not args.reason.strip():
        raise PumpError("forget needs a --reason: it is audited")
    kafka = sink(settings, args.feed)
    client = redis_client(settings)
    try:
        kafka.open()  # a running pump of the feed is fenced before the checkpoint is read
        before = kafka.checkpoint()
        if before is None:
            raise PumpError(f"{feed_key(args.feed)} has no checkpoint to forget")
        kafka.forget()
        _audit(settings, client, args, "forget", before)
    finally:
        kafka.close()
        client.close()
    print(
        f"{feed_key(args.feed)}: checkpoint at sequence {before.sequence} ({before.identity}) "
        "forgotten (audited); the next pump installs anew at sequence 0"
    )
    return 0


def feed_server(settings: Settings, args: argparse.Namespace) -> int:
    server = FeedServer(
        Path(args.file),
        Identity(args.corpus_id, args.lineage),
        page_size=args.page_size,
        port=args.port,
    )
    say(f"feed-server: {args.file} at {server.url} ({Identity(args.corpus_id, args.lineage)})")
    stop = stop_on_signals()
    server.start()
    try:
        stop.wait()
    finally:
        server.close()
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "pump",
        help="pump an upstream NDJSON change feed into the streams (docs/pump.md)",
        description="Without a subcommand: run the pump of --feed (long-running; --once for one "
        "pass to the feed's end). Each batch and its checkpoint commit in one Kafka transaction.",
    )
    p.add_argument("--feed", type=feed_url, metavar="URL", help="the feed's URL")
    p.add_argument("--once", action="store_true", help="one pass: stop once caught up")
    p.add_argument(
        "--legacy-corpus-id", metavar="UUID", help="the corpus id a legacy sequence belongs to"
    )
    p.add_argument(
        "--legacy-lineage", metavar="UUID", help="the history lineage a legacy sequence belongs to"
    )
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(handler=pump, pump_command=None)
    commands = p.add_subparsers(dest="pump_command")

    c = commands.add_parser("checkpoint", help="the feed's checkpoint")
    c.add_argument("--feed", type=feed_url, metavar="URL", required=True, help="the feed's URL")
    c.add_argument("--json", action="store_true", help="print JSON")
    c.set_defaults(pump_handler=checkpoint)

    c = commands.add_parser(
        "skip-through", help="move the checkpoint past a refused line (audited)"
    )
    c.add_argument("sequence", type=positive_int, metavar="SEQUENCE", help="the new checkpoint")
    c.add_argument("--feed", type=feed_url, metavar="URL", required=True, help="the feed's URL")
    c.add_argument("--reason", required=True, help="why, for the audit log")
    c.add_argument("--who", help="operator name for the audit log (default: the login name)")
    c.set_defaults(pump_handler=skip_through)

    c = commands.add_parser(
        "forget",
        help="remove the feed's checkpoint, for a new lineage (audited; docs/pump.md)",
    )
    c.add_argument("--feed", type=feed_url, metavar="URL", required=True, help="the feed's URL")
    c.add_argument("--reason", required=True, help="why, for the audit log")
    c.add_argument("--who", help="operator name for the audit log (default: the login name)")
    c.set_defaults(pump_handler=forget)

    s = sub.add_parser("feed-server", help="serve an NDJSON file as a feed (the reference feed)")
    s.add_argument("--file", required=True, metavar="PATH", help="the NDJSON feed file")
    s.add_argument(
        "--corpus-id", required=True, metavar="UUID", help="the corpus id the feed answers with"
    )
    s.add_argument(
        "--lineage", required=True, metavar="UUID", help="the history lineage it answers with"
    )
    s.add_argument(
        "--port", type=non_negative_int, default=8770, help="default 8770; 0: any free port"
    )
    s.add_argument(
        "--page-size", type=positive_int, default=500, metavar="N", help="lines per page"
    )
    s.set_defaults(handler=feed_server)
