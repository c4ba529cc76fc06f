"""The TypeScript reference receiver (examples/http-receiver) under node: its own tests pass, and a
real worker (``rhumbatron worker --http``) on the real broker drives it through the contract —
done, a 503 with Retry-After, a 409 dead-lettered with its reason, follow-ups in a reply, more
work delivered under new webhook ids."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from router.settings import Settings
from router.wiring.workers import provision_queues
from streams.envelopes import decode_command
from streams.headers import ERROR, header_dict
from streams.topology import queue_name
from tests.support.environment import ROOT
from tests.support.kafka import read_all
from tests.support.node_receiver import SECRET, build, running
from tests.support.workers import commands, env_of, send, settings_factory, short_queues

pytestmark = pytest.mark.integration

QUEUE = "integration"
MAX = 1 << 20


@pytest.fixture(scope="module")
def built() -> Path:
    return build()


@pytest.fixture
def make(tmp_path: Path) -> Iterator[Callable[..., Settings]]:
    yield from settings_factory(tmp_path)


def test_a_worker_drives_the_typescript_receiver_through_the_contract(
    built: Path, make: Any, tmp_path: Path
) -> None:
    s = make(queues=short_queues(0.5, retries=2), retry_tiers_s=[1, 60])
    provision_queues(s, [QUEUE, "indexing"])
    journal = tmp_path / "receiver.ndjson"
    with running(built, journal) as url:
        modes = ["ok", "later", "conflict", "follow", "more"]
        sent = {m: commands(1, m, mode=m)[0] for m in modes}
        for m in modes:
            sent[m] = sent[m].model_copy(update={"command_type": "change.dispatch"})
        send(s, list(sent.values()), QUEUE)
        env = env_of(s)
        env["RHUMBATRON_HTTP_HANDLER_SECRETS"] = SECRET
        worker = subprocess.run(
            [sys.executable, "-m", "router.cli", "worker", "--queue", QUEUE, "--http", url,
             "--until-idle", "4"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=180,
        )  # fmt: skip
        assert worker.returncode == 0, worker.stderr[-3000:]
    lines = [json.loads(line) for line in journal.read_text().splitlines()]
    by_id: dict[str, list[tuple[str, int]]] = {}
    for line in lines:
        by_id.setdefault(line["id"], []).append((line["webhookId"], line["attempt"]))
    ids = {m: c.command_id for m, c in sent.items()}
    assert by_id[ids["ok"]] == [(ids["ok"], 1)]
    assert by_id[ids["later"]] == [(ids["later"], 2)]  # 503 first, done on its retry
    assert by_id[ids["more"]] == [
        (ids["more"], 1),
        (f"{ids['more']}.d2", 2),
        (f"{ids['more']}.d3", 3),
    ]
    assert ids["conflict"] not in by_id
    # The follow-up the receiver's reply asked for, on this queue, done by the same worker.
    assert by_id[f"{ids['follow']}.a1.f0"] == [(f"{ids['follow']}.a1.f0", 1)]
    indexing = read_all(s.kafka_bootstrap, [queue_name("indexing", s.env)], expect=1, timeout=20)
    assert [decode_command(m.value(), max_bytes=MAX).command_id for m in indexing] == [
        f"{ids['follow']}.a1.f1"
    ]
    (letter,) = read_all(
        s.kafka_bootstrap, [queue_name("dead-letter", s.env)], expect=1, timeout=20
    )
    reason = header_dict(letter.headers() or [])[ERROR] or b""  # type: ignore[arg-type]
    assert reason.startswith(b"HTTP 409 from") and b"already exists" in reason
