"""The streams' commands: ``provision``, ``topology``, ``produce`` (the synthetic workload straight to
the streams), ``status``, and ``demo``."""

from __future__ import annotations

import argparse
import secrets
import time
from dataclasses import replace

from consumers.redis_conn import address_of
from router.cli.common import non_negative_int, positive_int, print_json
from router.cli.observed import observed
from router.operator.service import OperatorService
from router.settings import Settings
from router.wiring.provisioning import (
    compact_names,
    environment_specs,
    missing_topics,
    provision_databases,
    provision_environment,
    require_topics,
)
from streams.admin import admin_client, describe_topology
from streams.envelopes import Event
from streams.errors import ConfigurationError, DeliveryFailed, FailedRecord
from streams.producer import DeliveryReport, Producer, send_to_streams
from streams.workload import project_ids, slotted_events, workload

# ``produce --drill``: what each kind is, for its help and its summary.
DRILLS = {
    "fail": "an event the ledger subscription fails on every time (payload drill=fail): "
    "dead-lettered as an event batch after max_batch_failures attempts",
    "garbage": "bytes that are not an envelope: every subscription dead-letters them at once "
    "as a poison record",
}
GARBAGE = b"\x00not an envelope: a drill's poison record\xff"


def provision(settings: Settings, args: argparse.Namespace) -> int:
    from router.wiring.processors import slug_of

    report = provision_environment(
        settings, subscriptions=[slug_of(settings, spec) for spec in args.subscription]
    )
    print(f"provisioned environment '{settings.env}': {report.summary()}")
    for name in report.created:
        print(f"  created {name}")
    for warning in report.warnings:
        print(f"  warning: {warning}")
    for line in provision_databases(settings, args.subscription):
        print(f"  database of {line}")
    return 0


def topology(settings: Settings, args: argparse.Namespace) -> int:
    base = settings.kafka_config()
    described = describe_topology(
        admin_client(base), base, settings.topology, settings.connect_timeout_s
    )
    if args.json:
        print_json(described)
    else:
        for group, topics in described.items():
            print(f"{group}:")
            for t in topics:
                print(
                    f"  {t['name']:<44} partitions={t['partitions']:<3} retention_ms={t['retention_ms']}"
                )
    return 0


def produce(settings: Settings, args: argparse.Namespace) -> int:
    if args.drill:
        if args.outbox or args.projects is not None or args.events is not None:
            raise ConfigurationError(
                "produce --drill writes one record straight to a stream: it takes neither "
                "--outbox nor --projects/--events"
            )
    elif args.projects is None or args.events is None:
        raise ConfigurationError(
            "produce needs --projects N and --events M (or --drill fail|garbage for one drill "
            "record)"
        )
    # Where traces start: each event (or the outbox's each transaction) in a span of its own.
    with observed(settings, "producer", needs=("kafka",)) as health:
        health.ready = True
        if args.drill:
            return produce_drill(settings, args)
        if args.outbox:
            from router.cli.outbox_commands import produce_to_outbox

            return produce_to_outbox(settings, args)
        return _produce_to_streams(settings, args)


def _produce_to_streams(settings: Settings, args: argparse.Namespace) -> int:
    run = args.run or secrets.token_hex(4)
    base = settings.kafka_config()
    require_topics(settings, settings.topology.stream_names())
    events = slotted_events(workload(run, args.projects, args.events), tenant_id="tenant-demo")
    producer = Producer(base)
    started = time.perf_counter()
    counts = send_to_streams(
        producer,
        events,
        stream_for=settings.topology.stream_for,
        max_bytes=settings.max_envelope_bytes,
        flush_timeout=settings.produce_flush_timeout_s,
    )
    elapsed = time.perf_counter() - started
    result = {
        "run": run,
        "projects": args.projects,
        "events": len(events),
        "streams": counts,
        "seconds": round(elapsed, 3),
    }
    if args.json:
        print_json(result)
    else:
        print(
            f"produced {len(events)} events over {args.projects} projects (run {run}) in {elapsed:.2f}s"
        )
    return 0


def produce_drill(settings: Settings, args: argparse.Namespace) -> int:
    """One drill record on a stream, where the docs say it goes (docs/guarantees.md): ``fail``,
    an event of a fresh project (slot 1) whose payload has ``"drill": "fail"``; ``garbage``,
    bytes that do not decode to an envelope, keyed like a project so they land on one
    partition."""
    run = args.run or secrets.token_hex(4)
    (project,) = project_ids(f"{run}-drill", 1)
    topic, partition = settings.topology.partition_of(project)
    require_topics(settings, [topic])
    producer = Producer(settings.kafka_config())
    reports: list[DeliveryReport] = []
    event: Event | None = None
    if args.drill == "fail":
        (draft,) = workload(f"{run}-drill", 1, 1)
        draft = replace(draft, payload={**draft.payload, "drill": "fail"})
        (event,) = slotted_events([draft], tenant_id="tenant-demo")
        producer.produce_event(
            topic,
            event,
            max_bytes=settings.max_envelope_bytes,
            partition=partition,
            on_delivery=reports.append,
        )
    else:
        producer.produce(
            topic, GARBAGE, key=project, partition=partition, on_delivery=reports.append
        )
    producer.flush(settings.produce_flush_timeout_s)
    (report,) = reports
    if not report.ok:
        raise DeliveryFailed([FailedRecord(topic, project, report.describe_error(), False, False)])
    result = {
        "drill": args.drill,
        "topic": report.topic,
        "partition": report.partition,
        "offset": report.offset,
        "project": project,
        "event_id": event.event_id if event is not None else None,
        "what": DRILLS[args.drill],
    }
    if args.json:
        print_json(result)
    else:
        what = f"drill event {event.event_id} of project {project}" if event else "poison record"
        print(
            f"produced a {what} at {report.topic}[{report.partition}]@{report.offset}: "
            f"{DRILLS[args.drill]}; see it with: rhumbatron dead-letters list"
        )
    return 0


def status(settings: Settings, args: argparse.Namespace) -> int:
    base = settings.kafka_config()
    admin = admin_client(base)
    timeout = settings.connect_timeout_s
    described = describe_topology(admin, base, settings.topology, timeout)
    topics = [t["name"] for group in described.values() for t in group]
    # A read: it reports what is missing of the plan `rhumbatron provision` makes, never creates.
    from router.wiring.processors import subscription_slugs

    plan = environment_specs(settings.topology, subscription_slugs(settings))
    missing = missing_topics(settings, [spec.name for spec in plan])
    from router.wiring.subscription import redis_client

    redis_client(settings, timeout=timeout).close()
    groups = {
        g.group: {
            "total_lag": g.total_lag,
            "partitions": [
                p.model_dump() for p in g.partitions if p.committed is not None or p.end
            ],
        }
        for g in OperatorService(settings).lag().subscriptions
    }
    result = {
        "env": settings.env,
        "kafka": settings.kafka_bootstrap,
        "redis": address_of(settings.redis_url),
        "state_dir": str(settings.state_dir),
        "topics": described,
        "missing_topics": missing,
        "groups": groups,
    }
    if args.json:
        print_json(result)
    else:
        print(
            f"environment {settings.env}: kafka {settings.kafka_bootstrap}, redis "
            f"{result['redis']}, state dir {settings.state_dir}"
        )
        print(f"  {len(topics)} topics; {len(groups)} consumer groups")
        if missing:
            print(
                f"  not provisioned: missing {compact_names(missing)} ({len(missing)} topics); "
                "run `rhumbatron provision`"
            )
        for name, g in groups.items():
            print(f"  {name:<50} lag {g['total_lag']}")
    return 0


def demo(settings: Settings, args: argparse.Namespace) -> int:
    from router.demo import run_demo

    with observed(settings, "demo", needs=("kafka",)) as health:
        health.ready = True  # its parts run as processes of their own, each observed
        return run_demo(
            settings,
            projects=args.projects,
            events=args.events,
            serve=args.serve,
            outbox=args.outbox,
            beat=health.beat,
        )


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "provision",
        help="create the environment's streams, queues, retry, redelivery and internal topics "
        "(the only command that creates topics), and the SQL-effect subscriptions' tables",
    )
    p.add_argument(
        "--subscription",
        action="append",
        default=[],
        metavar="SPEC",
        help="also a subscription named by its package.module:attr alone (repeatable); those "
        "installed or of the settings' [subscriptions.<slug>] are provisioned anyway",
    )
    p.set_defaults(handler=provision)

    p = sub.add_parser("topology", help="the environment's topics as they exist on the broker")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler=topology)

    p = sub.add_parser(
        "produce",
        help="write a synthetic workload of M events over N projects, or one drill record",
    )
    p.add_argument(
        "--projects", type=positive_int, metavar="N", help="how many projects (not with --drill)"
    )
    p.add_argument(
        "--events",
        type=non_negative_int,
        metavar="M",
        help="how many events in all, spread over the projects (not with --drill)",
    )
    p.add_argument(
        "--drill",
        choices=sorted(DRILLS),
        help="instead of a workload, one drill record: "
        + "; ".join(f"{name}: {what}" for name, what in sorted(DRILLS.items())),
    )
    p.add_argument("--run", help="run id baked into project ids (default: random)")
    p.add_argument(
        "--outbox",
        metavar="ADDRESS",
        help="write through this outbox, a SQLite file or a postgresql:// URL (concurrent writers; rhumbatron publish sends it)",
    )
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(handler=produce)

    p = sub.add_parser("status", help="topics, and consumer lag per group and partition")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler=status)

    p = sub.add_parser("demo", help="the main job: provision, produce, consume, print the figures")
    p.add_argument(
        "--projects", type=positive_int, default=200, metavar="N", help="how many projects"
    )
    p.add_argument(
        "--events",
        type=non_negative_int,
        default=10_000,
        metavar="M",
        help="how many events in all, spread over the projects",
    )
    p.add_argument(
        "--no-serve",
        dest="serve",
        action="store_false",
        help="do not leave the operator page running afterwards",
    )
    p.add_argument(
        "--outbox",
        metavar="ADDRESS",
        help="the outbox of the run, a SQLite file or a postgresql:// URL (its schema made if "
        "missing); default: the environment's (router_outbox_path)",
    )
    p.set_defaults(handler=demo)
