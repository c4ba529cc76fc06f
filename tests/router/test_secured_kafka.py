"""Rhumbatron through the local broker's secured listener only (SASL_SSL, SCRAM-SHA-512, the CA
infra/local.sh made, the broker's name checked): provision, the outbox published, a subscription
folding its views, a command worker, the analytics projector and the faust rollup counting its
points — each checked on what it produced, every client logging in; and a wrong password refused
in one line that names the listener, the mechanism and the user, never the password."""

from __future__ import annotations

import secrets
import socket
import subprocess
import sys
import time
import uuid
from collections import Counter as Tally
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import confluent_kafka
import orjson
import pytest
import trustme

from consumers.redis_conn import connect
from consumers.runtime.types import TP
from consumers.subscriptions.analytics.projector import METRICS
from consumers.subscriptions.projector.view import count_views, read_view
from router.settings import Settings
from router.wiring.analytics import fetch_view, rollup_app_id
from router.workers.drills import read_drill
from streams.admin import admin_client, delete_topics
from streams.envelopes import Event, format_time
from streams.errors import Unreachable
from streams.topology import queue_name
from tests.support.environment import (
    ROOT,
    TEST_KAFKA,
    cleanup_environment,
    make_settings,
    run_cli,
    subprocess_env,
)
from tests.support.kafka import events_of
from tests.support.projector_oracle import expected_view
from tests.support.runtime_processes import cli, consume_cli, runtime_settings
from tests.support.secured import ADMIN, APP, secured_listener
from tests.support.workers import commands, send

pytestmark = pytest.mark.integration

QUEUE = "agent-wakeups"
SETTLE_S = 120.0  # how long the rollup may take to start and count everything


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[Settings]:
    listener = secured_listener()
    s = runtime_settings(
        make_settings(
            kafka_bootstrap=listener.bootstrap,
            kafka_security_protocol="SASL_SSL",
            kafka_sasl_mechanism="SCRAM-SHA-512",
            kafka_sasl_username=ADMIN,
            kafka_sasl_password=listener.password(ADMIN),
            kafka_ssl_ca_file=str(listener.ca_file),
            analytics_rollup_port=_free_port(),
            analytics_rollup_dir=str(tmp_path / "rollup"),
        )
    )
    # Only the secured listener: not the PLAINTEXT address the other tests use.
    assert s.kafka_bootstrap == listener.bootstrap != TEST_KAFKA
    config = s.kafka_config()
    assert config["bootstrap.servers"] == listener.bootstrap
    assert config["security.protocol"] == "SASL_SSL"
    assert config["ssl.endpoint.identification.algorithm"] == "https"
    yield s
    base = s.kafka_config()
    try:
        admin = admin_client(base)
        mine = [t for t in admin.list_topics(timeout=10).topics if t.startswith(rollup_app_id(s))]
        delete_topics(admin, base, mine, timeout=30)
    except Exception:  # cleanup is best effort
        pass
    cleanup_environment(s)


def _read(s: Settings, topics: list[str], expect: int, timeout: float = 60) -> list[Any]:
    """Every committed record of ``topics``, read through the secured listener."""
    consumer = confluent_kafka.Consumer(
        {
            **s.kafka_config(),
            "group.id": f"test-secured-reader-{uuid.uuid4().hex}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    consumer.subscribe(topics)
    out: list[Any] = []
    deadline = time.monotonic() + timeout
    try:
        while len(out) < expect and time.monotonic() < deadline:
            out += [m for m in consumer.consume(1000, timeout=0.5) if m.error() is None]
    finally:
        consumer.close()
    return out


def _minute(moment: str) -> str:
    return moment[:17] + "00.000Z"


def _rollup_total(s: Settings, metric: str, total: int) -> dict[str, Any]:
    deadline = time.monotonic() + SETTLE_S
    view: dict[str, Any] | None = None
    while time.monotonic() < deadline:
        try:
            view = fetch_view(s, f"/analytics/metric/{metric}/", {"since": "0"})
        except Unreachable:
            view = None  # not up yet, or still recovering its tables
        if (
            view is not None
            and view["partitions"] == list(range(view["partitionsTotal"]))
            and view["total"] >= total
        ):
            return view
        time.sleep(0.3)
    raise AssertionError(f"the rollup did not count {total} {metric} points; last view: {view}")


def test_provision_publish_subscribe_work_and_roll_up_through_the_secured_listener(
    secured: Settings, tmp_path: Path
) -> None:
    s = secured
    cli(s, "provision")
    present = admin_client(s.kafka_config()).list_topics(timeout=10).topics
    assert set(s.topology.stream_names()) | {queue_name(QUEUE, s.env)} <= set(present)

    # The outbox, written by the synthetic writers and published through the listener.
    outbox = str(tmp_path / "outbox.sqlite")
    made = orjson.loads(
        cli(s, "produce", "--outbox", outbox, "--projects", "4", "--events", "240", "--json").stdout
    )
    assert made["events"] == 240
    published = orjson.loads(
        cli(s, "publish", "--outbox", outbox, "--until-empty", "--json").stdout
    )
    assert (published["published"], published["failed"]) == (240, 0)
    events: list[Event] = events_of(_read(s, s.topology.stream_names(), expect=240))
    assert len(events) == 240

    # One subscription folds them into the project views, read back through the CLI too.
    done = consume_cli(s, "project-view-projector", until_idle=5, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    client = connect(s.redis_url, timeout=5)
    projects = sorted({e.project_id for e in events})
    assert len(projects) == 4 and count_views(client, s.env) == 4
    for p in projects:
        tp = TP(*s.topology.partition_of(p))
        assert read_view(client, s.env, tp, p) == expected_view(p, tp, events), p
    shown = orjson.loads(cli(s, "view", projects[0], "--json").stdout)
    tp = TP(*s.topology.partition_of(projects[0]))
    assert shown == expected_view(projects[0], tp, events)

    # A command worker handles what is on its queue, each command once.
    sent = commands(12, "sec")
    send(s, sent, QUEUE)
    cli(s, "worker", "--queue", QUEUE, "--handler", "drill", "--until-idle", "4")
    assert read_drill(client, s.env, QUEUE)["ok"] == {c.command_id: 1 for c in sent}

    # The analytics projector writes the points; the faust rollup (aiokafka) logs in with the
    # same credentials and counts them per minute.
    done = consume_cli(s, "analytics-projector", until_idle=5, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    with_metric = [e for e in events if e.event_type in METRICS]
    assert with_metric
    log = tmp_path / "rollup.log"
    rollup = subprocess.Popen(
        [sys.executable, "-m", "router.cli", "analytics-rollup", "--log-level", "info"],
        cwd=ROOT,
        env=subprocess_env(s),
        stdout=subprocess.DEVNULL,
        stderr=log.open("ab"),
    )
    try:
        for metric in sorted({METRICS[e.event_type] for e in with_metric}):
            mine = [e for e in with_metric if METRICS[e.event_type] == metric]
            view = _rollup_total(s, metric, len(mine))
            assert view["total"] == len(mine), metric
            expected = Tally(_minute(format_time(e.timestamp)) for e in mine)
            assert {w["start"]: w["count"] for w in view["windows"]} == dict(expected), metric
    finally:
        if rollup.poll() is None:
            rollup.kill()
        rollup.wait(30)


def test_a_wrong_password_fails_in_one_line_naming_the_listener_never_the_password(
    secured: Settings,
) -> None:
    s = secured
    wrong = "wrong-" + secrets.token_hex(8)
    env = subprocess_env(
        s,
        RHUMBATRON_KAFKA_SASL_USERNAME=APP,
        RHUMBATRON_KAFKA_SASL_PASSWORD=wrong,
        RHUMBATRON_CONNECT_TIMEOUT_S="3",
    )
    # provision, and a runtime command (which checks its topics first).
    for args in (
        ["provision"],
        ["consume", "--subscription", "audit-archiver", "--until-idle", "1"],
    ):
        refused = run_cli(s, *args, env=env)
        assert refused.returncode == 2, refused.stderr
        [line] = refused.stderr.strip().splitlines()
        assert line.startswith(
            f"rhumbatron: Kafka at {s.kafka_bootstrap} (SASL_SSL, SCRAM-SHA-512, user {APP}) "
            "refused the login: "
        ), (args, line)
        assert "Authentication failed" in line
        assert wrong not in refused.stdout + refused.stderr
        assert secured_listener().password(APP) not in refused.stdout + refused.stderr


def test_a_ca_that_did_not_sign_the_broker_fails_in_one_line(
    secured: Settings, tmp_path: Path
) -> None:
    other = tmp_path / "other-ca.pem"
    trustme.CA().cert_pem.write_to_path(str(other))
    env = subprocess_env(
        secured, RHUMBATRON_KAFKA_SSL_CA_FILE=str(other), RHUMBATRON_CONNECT_TIMEOUT_S="3"
    )
    refused = run_cli(secured, "provision", env=env)
    assert refused.returncode == 2, refused.stderr
    [line] = refused.stderr.strip().splitlines()
    assert line.startswith(
        f"rhumbatron: Kafka at {secured.kafka_bootstrap} (SASL_SSL, SCRAM-SHA-512, user {ADMIN}) "
        "failed the TLS handshake: "
    ), line
    assert "certificate verify failed" in line
    assert secured.kafka_sasl_password is not None
    assert secured.kafka_sasl_password.get_secret_value() not in refused.stdout + refused.stderr
