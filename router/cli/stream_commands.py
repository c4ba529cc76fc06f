"""The streams' commands: ``provision``, ``topology``, ``produce`` (the synthetic workload straight to
the streams), ``status``, and ``demo``."""

from __future__ import annotations

import argparse
import secrets
import time

from consumers.redis_conn import address_of
from router.cli.common import non_negative_int, positive_int, print_json
from router.operator.service import OperatorService
from router.settings import Settings
from streams.admin import (
    admin_client,
    describe_topology,
    ensure_reachable,
)
from streams.admin import (
    provision as provision_topics,
)
from streams.producer import Producer, send_to_streams
from streams.workload import slotted_events, workload


def provision(settings: Settings, args: argparse.Namespace) -> int:
    base = settings.kafka_config()
    report = provision_topics(
        admin_client(base),
        base,
        settings.topology.all_specs(),
        topology=settings.topology,
        timeout=settings.connect_timeout_s,
    )
    print(f"provisioned environment '{settings.env}': {report.summary()}")
    for name in report.created:
        print(f"  created {name}")
    for warning in report.warnings:
        print(f"  warning: {warning}")
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
    if args.outbox:
        from router.cli.outbox_commands import produce_to_outbox

        return produce_to_outbox(settings, args)
    run = args.run or secrets.token_hex(4)
    base = settings.kafka_config()
    ensure_reachable(admin_client(base), base, settings.connect_timeout_s)
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


def status(settings: Settings, args: argparse.Namespace) -> int:
    base = settings.kafka_config()
    admin = admin_client(base)
    timeout = settings.connect_timeout_s
    described = describe_topology(admin, base, settings.topology, timeout)
    topics = [t["name"] for group in described.values() for t in group]
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
        "topics": described,
        "groups": groups,
    }
    if args.json:
        print_json(result)
    else:
        print(
            f"environment {settings.env}: kafka {settings.kafka_bootstrap}, redis {result['redis']}"
        )
        print(f"  {len(topics)} topics; {len(groups)} consumer groups")
        for name, g in groups.items():
            print(f"  {name:<50} lag {g['total_lag']}")
    return 0


def demo(settings: Settings, args: argparse.Namespace) -> int:
    from router.demo import run_demo

    return run_demo(settings, projects=args.projects, events=args.events, serve=args.serve)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "provision", help="create the environment's streams, queues and internal topics"
    )
    p.set_defaults(handler=provision)

    p = sub.add_parser("topology", help="the environment's topics as they exist on the broker")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler=topology)

    p = sub.add_parser("produce", help="write a synthetic workload of M events over N projects")
    p.add_argument(
        "--projects", type=positive_int, required=True, metavar="N", help="how many projects"
    )
    p.add_argument(
        "--events",
        type=non_negative_int,
        required=True,
        metavar="M",
        help="how many events in all, spread over the projects",
    )
    p.add_argument("--run", help="run id baked into project ids (default: random)")
    p.add_argument(
        "--outbox",
        metavar="PATH",
        help="write through this outbox (concurrent writers; rhumbatron publish sends it)",
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
    p.set_defaults(handler=demo)
