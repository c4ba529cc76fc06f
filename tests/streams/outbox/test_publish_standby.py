"""``rhumbatron publish`` as active and standby, on a SQLite and a PostgreSQL outbox, against the
real broker: a second publisher of an outbox that has one stands by, ready and live, while the
first publishes; the first SIGKILLed, the second takes over and publishes what is written after,
once each and in order; a standby stops cleanly on SIGTERM."""

from __future__ import annotations

import functools
import json
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import IO, Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from router.settings import Settings
from streams.admin import admin_client, provision
from streams.outbox.store import RowState
from tests.support.environment import ROOT
from tests.support.kafka import events_of, read_all
from tests.support.outbox import OutboxBackend, cli_env, drafts, records_in
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration

PROJECT = "standby-p"
START_TIMEOUT_S = 60.0  # a bound against a hang, not a measured expectation


class PublishProcess:
    """One ``rhumbatron publish`` of the outbox, with its metrics endpoint on a free port; its
    stderr in a file."""

    def __init__(self, s: Settings, address: str, log: Path) -> None:
        self.log = log
        self._out: IO[bytes] = log.open("wb")
        env = cli_env(
            s,
            RHUMBATRON_METRICS_HOST="127.0.0.1",
            RHUMBATRON_METRICS_PORT="0",
            RHUMBATRON_PUBLISHER_STANDBY_POLL_S="0.2",
        )
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "router.cli", "publish", "--outbox", address],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=self._out,
        )
        self.pid = self.proc.pid
        self.url = ""

    def serving(self) -> PublishProcess:
        wait_until(self._serving, START_TIMEOUT_S, f"publish {self.pid} serves /metrics", self.said)
        return self

    def said(self) -> str:
        return self.log.read_text(errors="replace")

    def _serving(self) -> bool:
        assert self.proc.poll() is None, f"publish exited {self.proc.returncode}:\n{self.said()}"
        found = re.search(r"metrics endpoint (http://\S+)/metrics", self.said())
        self.url = found.group(1) if found else ""
        return bool(found)

    def probe(self, path: str) -> tuple[int, dict[str, Any]]:
        try:
            with urllib.request.urlopen(self.url + path, timeout=10) as answer:
                return answer.status, json.loads(answer.read())
        except urllib.error.HTTPError as refused:
            return refused.code, json.loads(refused.read())

    def metric(self, name: str) -> float | None:
        """The value of the one series of ``name`` this process shows; None if none."""
        with urllib.request.urlopen(self.url + "/metrics", timeout=10) as answer:
            text = answer.read().decode()
        values = [
            sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == name
        ]
        assert len(values) <= 1, f"{name}: {values}"
        return values[0] if values else None

    def active(self) -> float | None:
        return self.metric("rhumbatron_publisher_active")

    def stop(self, sig: signal.Signals) -> int:
        self.proc.send_signal(sig)
        code = self.proc.wait(START_TIMEOUT_S)
        self._out.close()
        return code

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)
        self._out.close()


def _standing_by(p: PublishProcess) -> bool:
    return p.probe("/readyz")[0] == 200 and p.active() == 0


def test_a_second_publisher_stands_by_and_takes_over_when_the_first_is_killed(
    settings: Settings, outbox_backend: OutboxBackend, tmp_path: Path
) -> None:
    stream = settings.topology.stream_for(PROJECT)
    base = settings.kafka_config()
    specs = [spec for spec in settings.topology.stream_specs() if spec.name == stream]
    provision(admin_client(base), base, specs, topology=settings.topology, timeout=30)
    store = outbox_backend.store()  # the outbox exists before anyone publishes it
    written = drafts(PROJECT, 5)
    started: list[PublishProcess] = []

    def start(name: str) -> PublishProcess:
        started.append(PublishProcess(settings, outbox_backend.address, tmp_path / f"{name}.log"))
        return started[-1]

    try:
        first = start("first").serving()
        wait_until(lambda: first.active() == 1, START_TIMEOUT_S, "the first publishes", first.said)
        second, third = start("second"), start("third")
        for standby in (second.serving(), third.serving()):
            ready = functools.partial(_standing_by, standby)
            wait_until(ready, START_TIMEOUT_S, "a ready standby", standby.said)
            assert standby.probe("/healthz")[0] == 200
            holder = (
                f"process {first.pid} holds"
                if outbox_backend.schema is None
                else f"pid {first.pid} on"
            )
            assert re.search(f"standing by: .*{holder}", standby.said()), standby.said()
            assert standby.said().count("standing by") == 1  # said once, however many tries
        # A standby stops cleanly, having published nothing.
        assert third.stop(signal.SIGTERM) == 0, third.said()
        assert third.proc.stdout is not None
        assert third.proc.stdout.read().decode().startswith("published 0 rows")

        with store.transaction() as unit:
            unit.append(PROJECT, written[:3], tenant_id="t")
        wait_until(
            lambda: store.counts()[RowState.PUBLISHED] == 3, START_TIMEOUT_S, "3 rows published"
        )
        # Through the first: the standby sent nothing.
        assert first.metric("rhumbatron_outbox_published_total") == 3
        assert not second.metric("rhumbatron_outbox_published_total")
        assert second.active() == 0

        first.stop(signal.SIGKILL)
        wait_until(lambda: second.active() == 1, START_TIMEOUT_S, "the standby took over")
        with store.transaction() as unit:
            unit.append(PROJECT, written[3:], tenant_id="t")
        wait_until(
            lambda: store.counts()[RowState.PUBLISHED] == 5, START_TIMEOUT_S, "5 rows published"
        )
        assert second.metric("rhumbatron_outbox_published_total") == 2
        assert second.stop(signal.SIGTERM) == 0, second.said()
    finally:
        for p in started:
            p.close()
    got = events_of(read_all(settings.kafka_bootstrap, [stream], expect=5))
    assert [(e.event_id, e.slot) for e in got] == [
        (d.event_id, n) for n, d in enumerate(written, 1)
    ]
    assert records_in(settings.kafka_bootstrap, [stream]) == 5  # once each
