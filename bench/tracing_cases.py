"""project-view-projector traced: with tracing off (telemetry started, no exporter configured, so
no provider installed), on at 1 % sampling and on at 100 %, exporting over OTLP/HTTP to a sink
process (bench.otlp_sink), each against the same projector with telemetry never started
(``subscription: project-view-projector``, bench.projector_cases) in the same run.

Sampling is decided where a trace starts: the setup writes every event inside a root span of
its own (as a writer or ``rhumbatron produce`` does), sampled at the case's ratio, so the events
carry their ``traceparent`` and the projector's spans follow it. The sink's span count is in the
note; the time includes the final flush of the spans still queued.
"""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Callable

from opentelemetry import trace
from opentelemetry.trace import SpanKind

from bench.harness import BenchEnv, case
from consumers.redis_conn import connect
from consumers.subscriptions.projector.view import count_views
from router.settings import Settings
from router.wiring import telemetry
from router.wiring.provisioning import provision_environment
from router.wiring.subscription import open_subscription
from streams.producer import DELIVERY_POLL_EVERY, Producer
from streams.workload import slotted_events, workload

UNTRACED = "subscription: project-view-projector"
SLUG = "project-view-projector"
SINK_STOP_TIMEOUT_S = 30


def _start_sink(env: BenchEnv) -> None:
    # Its stderr is not the case's: the harness reads the case's output to its end, which an
    # orphaned sink would hold open.
    sink = subprocess.Popen(
        [sys.executable, "-m", "bench.otlp_sink"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    atexit.register(_stop, sink)
    assert sink.stdout is not None
    port = int(sink.stdout.readline().strip())
    env.scratch["sink"] = sink
    env.scratch["sink_url"] = f"http://127.0.0.1:{port}"
    os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = env.scratch["sink_url"]
    os.environ["OTEL_EXPORTER_OTLP_PROTOCOL"] = "http/protobuf"


def _stop(sink: subprocess.Popen[str]) -> None:
    if sink.poll() is None:
        sink.terminate()
        sink.wait(timeout=SINK_STOP_TIMEOUT_S)


def _traced_setup(ratio: float | None) -> Callable[[BenchEnv], None]:
    """A fresh environment's streams holding env.size events, each written in a root span
    sampled at ``ratio``; None: no exporter (tracing off)."""

    def setup(env: BenchEnv) -> None:
        for name in [n for n in os.environ if n.startswith("OTEL_")]:
            del os.environ[name]
        if ratio is not None:
            _start_sink(env)
        s = env.settings = Settings(
            **{
                **env.settings.model_dump(),
                "env": f"{env.settings.env}_{uuid.uuid4().hex[:6]}",
                "trace_sample_ratio": ratio if ratio is not None else 1.0,
            }
        )
        base = s.kafka_config()
        provision_environment(s)  # the subscriptions' redelivery topics too
        installed = telemetry.start(s, SLUG)
        env.scratch["telemetry"] = installed
        events = slotted_events(
            workload(uuid.uuid4().hex[:6], 500, env.size), tenant_id="tenant-bench"
        )
        producer = Producer(base)
        tracer = trace.get_tracer("bench.writer")
        for n, event in enumerate(events):
            topic = s.topology.stream_for(event.project_id)
            with tracer.start_as_current_span(f"publish {topic}", kind=SpanKind.PRODUCER):
                producer.produce_event(topic, event, max_bytes=s.max_envelope_bytes)
            if n % DELIVERY_POLL_EVERY == DELIVERY_POLL_EVERY - 1:
                producer.poll(0)
        producer.flush(120)
        if installed.provider is not None:
            installed.provider.force_flush()
        env.scratch["spans_before"] = _sink_spans(env)

    return setup


def _sink_spans(env: BenchEnv) -> int:
    url = env.scratch.get("sink_url")
    if url is None:
        return 0
    with urllib.request.urlopen(f"{url}/count", timeout=10) as answer:
        return int(json.loads(answer.read())["spans"])


def _project(env: BenchEnv) -> int:
    subscription = open_subscription(env.settings, SLUG)
    runner = subscription.runner
    installed: telemetry.Telemetry = env.scratch["telemetry"]
    try:
        runner.run(should_stop=lambda: runner.stats.records >= env.size, tick=subscription.tick)
    finally:
        subscription.close()
        installed.shutdown()
    views = count_views(connect(env.settings.redis_url, timeout=5), env.settings.env)
    note = f"{views} views; vs telemetry never started"
    sink = env.scratch.get("sink")
    if sink is not None:
        exported = _sink_spans(env) - env.scratch["spans_before"]
        note += f"; {exported} spans exported"
        _stop(sink)
    env.scratch["note"] = note
    return runner.stats.records


@case("projector tracing: off (no exporter)", baseline=UNTRACED, setup=_traced_setup(None))
def tracing_off(env: BenchEnv) -> int:
    return _project(env)


@case("projector tracing: on, 1% sampled, OTLP", baseline=UNTRACED, setup=_traced_setup(0.01))
def tracing_sampled(env: BenchEnv) -> int:
    return _project(env)


@case("projector tracing: on, 100% sampled, OTLP", baseline=UNTRACED, setup=_traced_setup(1.0))
def tracing_all(env: BenchEnv) -> int:
    return _project(env)
