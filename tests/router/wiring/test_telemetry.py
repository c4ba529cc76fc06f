"""The process's telemetry setup (router/wiring/telemetry.py): sampler from settings unless the
standard OTEL_TRACES_SAMPLER/_ARG say otherwise, exporters chosen by the standard variables (none
by default, and then no SDK provider at all), the resource, and a clear refusal of a bad value."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter
from opentelemetry.semconv._incubating.attributes import messaging_attributes as semconv
from pydantic import ValidationError

from router.settings import Settings
from router.wiring import telemetry
from streams import tracing
from streams.errors import ConfigurationError
from tests.support.environment import ROOT
from tests.support.tracing import no_provider


@pytest.fixture(autouse=True)
def _no_otel(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in list(os.environ):
        if name.startswith("OTEL_"):
            monkeypatch.delenv(name)
    with no_provider():
        yield


def _exporters(built: telemetry.Telemetry) -> list[object]:
    assert built.provider is not None
    processors = built.provider._active_span_processor._span_processors
    return [p.span_exporter for p in processors]  # type: ignore[attr-defined]


def _provider(installed: telemetry.Telemetry) -> TracerProvider | None:
    return installed.provider


def test_by_default_nothing_is_installed_and_the_api_stays_no_op() -> None:
    installed = telemetry.start(Settings(), "publisher")
    assert installed.provider is None and installed.service == "rhumbatron-publisher"
    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
    assert not tracing.active()
    installed.shutdown()


@pytest.mark.parametrize(
    ("variables", "expected"),
    [
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, ("otlp",)),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, ("otlp",)),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, ("otlp",)),
        ({"OTEL_TRACES_EXPORTER": "console"}, ("console",)),
        ({"OTEL_TRACES_EXPORTER": "Console, otlp"}, ("console", "otlp")),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4318"}, ()),
        ({"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4318"}, ()),
        ({}, ()),
    ],
)
def test_exporters_are_chosen_by_the_standard_variables(
    monkeypatch: pytest.MonkeyPatch, variables: dict[str, str], expected: tuple[str, ...]
) -> None:
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    assert telemetry.exporters() == expected
    built = telemetry.build(Settings(), "publisher")
    if not expected:
        assert built.provider is None
        return
    kinds = {"otlp": OTLPSpanExporter, "console": ConsoleSpanExporter}
    assert [type(e) for e in _exporters(built)] == [kinds[n] for n in expected]
    assert built.provider is not None
    built.provider.shutdown()


def test_start_installs_the_provider_and_shutdown_flushes_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")
    installed = telemetry.start(Settings(), "project-view-projector")
    try:
        assert trace.get_tracer_provider() is installed.provider
        assert tracing.active()
        again = telemetry.start(Settings(), "other")  # one provider per process
        assert again.provider is None and trace.get_tracer_provider() is installed.provider
    finally:
        installed.shutdown()
    assert _provider(installed) is None
    installed.shutdown()  # twice is harmless


def test_the_resource_names_the_role_environment_version_and_host(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")
    monkeypatch.setenv(
        "OTEL_RESOURCE_ATTRIBUTES", "team=routing,service.name=ignored,deployment.region=eu"
    )
    built = telemetry.build(Settings(env="staging"), "worker-agent-wake")
    assert built.provider is not None
    attributes = dict(built.provider.resource.attributes)
    assert attributes["service.name"] == "rhumbatron-worker-agent-wake"
    assert attributes["deployment.environment.name"] == "staging"
    assert attributes["host.name"] == socket.gethostname()
    assert attributes["service.version"] not in ("", None)
    assert attributes["team"] == "routing" and attributes["deployment.region"] == "eu"
    built.provider.shutdown()


def _description(settings: Settings) -> str:
    return telemetry.sampler(settings).get_description()


def test_the_sampler_is_parent_based_on_the_settings_ratio() -> None:
    assert _description(Settings(trace_sample_ratio=0.25)) == (
        "ParentBased{root:TraceIdRatioBased{0.25},remoteParentSampled:AlwaysOnSampler,"
        "remoteParentNotSampled:AlwaysOffSampler,localParentSampled:AlwaysOnSampler,"
        "localParentNotSampled:AlwaysOffSampler}"
    )


@pytest.mark.parametrize(
    ("name", "arg", "expected"),
    [
        ("always_off", None, "AlwaysOffSampler"),
        ("always_on", None, "AlwaysOnSampler"),
        ("traceidratio", "0.5", "TraceIdRatioBased{0.5}"),
        ("traceidratio", None, "TraceIdRatioBased{0.25}"),  # the ratio of the settings
        ("parentbased_traceidratio", "0.01", "ParentBased{root:TraceIdRatioBased{0.01},"),
        ("parentbased_always_off", None, "ParentBased{root:AlwaysOffSampler,"),
    ],
)
def test_otel_traces_sampler_and_its_argument_win(
    monkeypatch: pytest.MonkeyPatch, name: str, arg: str | None, expected: str
) -> None:
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", name)
    if arg is not None:
        monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", arg)
    assert _description(Settings(trace_sample_ratio=0.25)).startswith(expected)


@pytest.mark.parametrize(
    ("variables", "named"),
    [
        ({"OTEL_TRACES_SAMPLER": "sometimes"}, "OTEL_TRACES_SAMPLER='sometimes'"),
        (
            {"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "half"},
            "OTEL_TRACES_SAMPLER_ARG='half'",
        ),
        (
            {"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "2"},
            "OTEL_TRACES_SAMPLER_ARG='2'",
        ),
        ({"OTEL_TRACES_EXPORTER": "jaeger"}, "unknown trace exporter 'jaeger'"),
        ({"OTEL_TRACES_EXPORTER": "none,console"}, "'none' cannot be combined"),
        (
            {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
            "OTLP protocol 'grpc'",
        ),
    ],
)
def test_a_bad_value_is_refused_naming_it(
    monkeypatch: pytest.MonkeyPatch, variables: dict[str, str], named: str
) -> None:
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigurationError, match=named.replace("(", r"\(")) as caught:
        telemetry.start(Settings(), "publisher")
    assert named in str(caught.value)
    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


@pytest.mark.parametrize("ratio", [1.5, -1, "x"])
def test_a_wrong_sample_ratio_is_refused(ratio: object) -> None:
    with pytest.raises(ValidationError, match="trace_sample_ratio"):
        Settings(trace_sample_ratio=ratio)


@pytest.mark.parametrize("ratio", ["1.5", "-1", "x"])
def test_a_wrong_sample_ratio_from_the_environment_is_one_clear_line(ratio: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RHUMBATRON_", "OTEL_"))}
    env["RHUMBATRON_TRACE_SAMPLE_RATIO"] = ratio
    run = subprocess.run(
        [sys.executable, "-m", "router.cli", "publish", "--outbox", "/nonexistent/x.db"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode != 0
    assert "trace_sample_ratio" in run.stderr.lower()
    assert "Traceback" not in run.stderr


def test_the_attribute_names_are_the_semantic_conventions() -> None:
    assert tracing.MESSAGING_SYSTEM == semconv.MESSAGING_SYSTEM
    assert tracing.DESTINATION == semconv.MESSAGING_DESTINATION_NAME
    assert tracing.PARTITION == semconv.MESSAGING_DESTINATION_PARTITION_ID
    assert tracing.MESSAGE_KEY == semconv.MESSAGING_KAFKA_MESSAGE_KEY
    assert tracing.OFFSET == semconv.MESSAGING_KAFKA_OFFSET
    assert tracing.MESSAGE_ID == semconv.MESSAGING_MESSAGE_ID
    assert tracing.CONSUMER_GROUP == semconv.MESSAGING_CONSUMER_GROUP_NAME
    assert tracing.BATCH_COUNT == semconv.MESSAGING_BATCH_MESSAGE_COUNT
    assert tracing.OPERATION_TYPE == semconv.MESSAGING_OPERATION_TYPE
    assert tracing.OPERATION_NAME == semconv.MESSAGING_OPERATION_NAME
    assert semconv.MessagingSystemValues.KAFKA.value == tracing.KAFKA
    assert semconv.MessagingOperationTypeValues.SEND.value == tracing.SEND
    assert semconv.MessagingOperationTypeValues.PROCESS.value == tracing.PROCESS


def test_a_provider_built_has_room_for_a_batchs_links(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")
    built = telemetry.build(Settings(), "x")
    assert isinstance(built.provider, TracerProvider)
    assert built.provider._span_limits.max_links == telemetry.MAX_LINKS
    built.provider.shutdown()
