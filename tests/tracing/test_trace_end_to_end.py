"""End to end over OTLP: the real processes — ``produce --outbox`` (the writer), ``publish``, the
``project-view-projector`` and ``causal-router`` consumers and the ``integration`` queue's worker —
export to an OTLP/HTTP receiver in the test (tests/support/otlp.py) while they run on the real
broker, and a command the router sent is found at the end of ONE connected trace that runs from
the outbox write through the publish, both subscriptions' applies and the router's decision to
the worker's handling, across five services. Every span of it has its parent in it, and the
consumed batches link to the event's publish."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest
from opentelemetry.trace import SpanKind

from router.settings import Settings
from router.wiring.provisioning import provision_environment
from streams.topology import queue_name
from tests.support.otlp import OtlpReceiver, ReceivedSpan
from tests.support.traced_run import PROJECTOR, QUEUE, ROUTER, run_dispatch, traced_env

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_a_command_is_at_the_end_of_one_trace_from_the_outbox_write_to_the_worker(
    settings: Settings, tmp_path: Path
) -> None:
    provision_environment(settings)
    with OtlpReceiver() as receiver:
        env = traced_env(settings, receiver.endpoint)
        run_dispatch(settings, tmp_path / "outbox.sqlite", env)
        spans = receiver.spans()  # each process flushed its spans on its way out

    queue = queue_name(QUEUE, settings.env)
    handled = [
        s
        for s in spans
        if s.name == f"process {queue}"
        and s.attributes.get("rhumbatron.command_type") == "change.dispatch"
    ]
    assert handled, sorted({(s.service, s.name) for s in spans})
    handling = handled[0]
    assert handling.service == f"rhumbatron-worker-{QUEUE}"
    assert handling.kind is SpanKind.CONSUMER
    assert handling.attributes["rhumbatron.outcome"] == "ok"
    assert handling.attributes["messaging.destination.name"] == queue

    in_trace = [s for s in spans if s.trace_id == handling.trace_id]
    by_id = {s.span_id: s for s in in_trace}
    # Connected: one root (the writer's), every other span's parent in the same trace.
    roots = [s for s in in_trace if s.parent_id is None]
    assert [r.service for r in roots] == ["rhumbatron-producer"], roots
    orphans = [s for s in in_trace if s.parent_id is not None and s.parent_id not in by_id]
    assert not orphans, orphans

    def chain(span: ReceivedSpan) -> list[ReceivedSpan]:
        up = [span]
        while up[-1].parent_id is not None:
            up.append(by_id[up[-1].parent_id])
        return up

    # The worker's ancestry: the router's decision (its apply of the completing event), the
    # event's publish, the outbox write, the writer's root.
    path = chain(handling)
    services = [s.service for s in path]
    assert services[0] == f"rhumbatron-worker-{QUEUE}"
    assert services[-1] == "rhumbatron-producer"
    decision = path[1]
    assert decision.service == f"rhumbatron-{ROUTER}" and decision.name == "apply task.completed"
    publish = next(s for s in path if s.service == "rhumbatron-publisher")
    assert publish.kind is SpanKind.PRODUCER and publish.name.startswith("publish ")
    assert services.index("rhumbatron-publisher") > services.index(f"rhumbatron-{ROUTER}")

    # The projector applied the same event, parented on the same publish.
    [projected] = [
        s
        for s in in_trace
        if s.service == f"rhumbatron-{PROJECTOR}" and s.parent_id == publish.span_id
    ]
    assert projected.name == "apply task.completed"
    assert len({s.service for s in in_trace}) >= 5

    # Each subscription's batch holding the event links to its publish (a batch has many
    # parents, so it is a root of its own with links).
    linked: dict[str, list[ReceivedSpan]] = defaultdict(list)
    for s in spans:
        if (publish.trace_id, publish.span_id) in s.links:
            linked[s.service].append(s)
    for slug in (PROJECTOR, ROUTER):
        [batch] = linked[f"rhumbatron-{slug}"]
        assert batch.kind is SpanKind.CONSUMER and batch.name.startswith("process ")
        assert batch.attributes["messaging.batch.message_count"] >= 1
