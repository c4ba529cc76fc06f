"""Claim memory of outbox events: what a subscription with Kafka effects (the analytics projector)
keeps in Redis after 1,000,000 events over 1,000 projects, published as the outbox publisher
sends them (each project's slots 1, 2, 3 …, the ``outbox`` header naming one outbox).

``claim-memory-1m``: ``MEMORY USAGE`` summed over every key of the subscription (cursors,
epochs, layout markers, pending copies and claims, by slot and by id). ``claim-bytes-per-project``:
the slot-claim keys alone over the projects. With state layout 2 finalized, an outbox event's claim
is its project's record (a base slot, and what lies above it while a gap is open); before, each
event keeps a claim by id (``claim-bytes`` a claim) for the claims' life.

The events are published once a run, in setup, untimed, into an environment of their own
(``<run>_claims``); each round starts without the subscription's state and finalizes the layout
(a release that speaks layout 1 leaves the marker as it is, and measures its own claims).
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from datetime import UTC, datetime, timedelta

from bench.harness import BenchEnv, case
from bench.latency_cases import settings_environ
from bench.rows import Row
from bench.runtime_cases import consume, forget_subscription, redis_bytes
from bench.scale_cases import PUBLISH_CHUNK, ROOT, TENANT
from consumers.redis_conn import connect
from consumers.runtime import layout
from router.settings import Settings
from router.wiring.provisioning import provision_environment
from streams.envelopes import encode
from streams.headers import OUTBOX
from streams.outbox.identity import new_outbox_id
from streams.producer import Producer, event_headers
from streams.workload import workload

SLUG = "analytics-projector"
PROJECTS = 1_000
EVENTS = 1_000_000
EVENTS_QUICK = 100_000
PUBLISHED = "claims-published"  # the marker file in the run's folder


def publish(s: Settings, projects: int, count: int) -> None:
    """``count`` events over ``projects`` projects, each with its slot and the ``outbox`` header
    of one outbox, as its publisher sends them; built and sent a chunk at a time."""
    provision_environment(s, subscriptions=[SLUG])
    producer = Producer(s.kafka_config())
    outbox = new_outbox_id().encode()
    drafts = workload(uuid.uuid4().hex[:6], projects, count)
    start_at = datetime.now(UTC)
    next_slot: dict[str, int] = {}
    for start in range(0, count, PUBLISH_CHUNK):
        for n, draft in enumerate(drafts[start : start + PUBLISH_CHUNK], start):
            slot = next_slot.get(draft.project_id, 0) + 1
            next_slot[draft.project_id] = slot
            moment = start_at + timedelta(milliseconds=n)
            event = draft.to_event(tenant_id=TENANT, timestamp=moment, slot=slot)
            producer.produce(
                s.topology.stream_for(event.project_id),
                encode(event, max_bytes=s.max_envelope_bytes),
                key=event.project_id,
                headers=[*event_headers(event), (OUTBOX, outbox)],
            )
        producer.flush(300)
        print(f"    claims: published {min(start + PUBLISH_CHUNK, count)}/{count}", file=sys.stderr)


def _setup(env: BenchEnv) -> None:
    s = env.scratch["claims"] = Settings(
        **{**env.settings.model_dump(), "env": f"{env.settings.env}_claims"}
    )
    count = EVENTS_QUICK if env.quick else EVENTS
    env.scratch["claims-count"] = count
    marker = env.run_dir / PUBLISHED
    if not marker.exists():
        subprocess.run(
            [sys.executable, "-m", "bench.claim_cases", str(PROJECTS), str(count)],
            cwd=ROOT,
            env=settings_environ(s),
            check=True,
        )
        marker.write_text(str(count))
    forget_subscription(s, SLUG)
    client = connect(s.redis_url, timeout=5)
    try:
        layout.finalize(client, s.env)
    finally:
        client.close()


def _teardown(env: BenchEnv) -> None:
    forget_subscription(env.scratch["claims"], SLUG)


@case("claims", setup=_setup, teardown=_teardown)
def claims(env: BenchEnv) -> list[Row]:
    s: Settings = env.scratch["claims"]
    count: int = env.scratch["claims-count"]
    run = consume(env, SLUG, s, count=count)
    every = redis_bytes(env, f"rh:{s.env}:{{{SLUG}|*", settings=s)
    slots = redis_bytes(env, f"rh:{s.env}:{{{SLUG}|*}}:sc:*", settings=s)
    what = f"{count:,} events over {PROJECTS:,} projects, state layout {layout.LAYOUT}"
    return [
        Row(
            "claim-memory-1m",
            every / 2**20,
            "MB",
            note=f"MEMORY USAGE of every key of the {SLUG} after {what} "
            f"({run.stats.applied:,} applied)",
        ),
        Row(
            "claim-bytes-per-project",
            slots / PROJECTS,
            "B",
            note=f"its slot-claim keys over the projects, {what}",
        ),
    ]


if (
    __name__ == "__main__"
):  # python -m bench.claim_cases PROJECTS EVENTS (setup, in its own process)
    publish(Settings(), int(sys.argv[1]), int(sys.argv[2]))
