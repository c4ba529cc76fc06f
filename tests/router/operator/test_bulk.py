"""Dead letters in bulk over the HTTP API, on a real server over the real broker and Redis:
letters of several subscriptions and kinds, two operators with their own tokens, a dry run that
changes nothing, real runs that touch exactly the filtered letters, each audited naming the
operator whose token acted, and the read token refused."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import confluent_kafka
import httpx
import pytest
from pydantic import SecretStr

from router.operator.service import OperatorService
from router.settings import Settings
from streams.topology import queue_name, redelivery_topic
from tests.support.environment import cleanup_environment, make_settings
from tests.support.letters import Mixed, write_mixed
from tests.support.operator import running_server
from tests.support.runtime_processes import cli

pytestmark = pytest.mark.integration

ANN_TOKEN = "ann-" + secrets.token_hex(16)
BOB_TOKEN = "bob-" + secrets.token_hex(16)
READ_TOKEN = "read-" + secrets.token_hex(16)
ANN = {"Authorization": f"Bearer {ANN_TOKEN}"}
BOB = {"Authorization": f"Bearer {BOB_TOKEN}"}
READ = {"Authorization": f"Bearer {READ_TOKEN}"}


@dataclass
class World:
    s: Settings
    letters: Mixed
    http: httpx.Client

    def letter(self, letter_id: str) -> dict[str, Any]:
        found: dict[str, Any] = self.http.get(f"/api/dead-letters/{letter_id}", headers=READ).json()
        return found

    def states(self) -> dict[str, tuple[str, int]]:
        return {
            i: (shown["status"], len(shown["audit"]))
            for i in self.letters.all()
            for shown in [self.letter(i)]
        }


@pytest.fixture
def world() -> Iterator[World]:
    s = make_settings()
    try:
        cli(s, "provision")
        letters = write_mixed(s)
        operator = s.model_copy(
            update={
                "operator_token": SecretStr(ANN_TOKEN),
                "operator_token_name": "ann",
                "operator_tokens": {"bob": SecretStr(BOB_TOKEN)},
                "operator_read_token": SecretStr(READ_TOKEN),
            }
        )
        service = OperatorService(operator)
        with running_server(service) as url, httpx.Client(base_url=url, timeout=60) as http:
            yield World(s, letters, http)
        service.close()
    finally:
        cleanup_environment(s)


def _records(s: Settings, topic: str) -> int:
    """Records on ``topic`` (its end offsets less its start ones): an operator retry returns
    once its records are acknowledged, so the count is exact."""
    consumer = confluent_kafka.Consumer(
        {"bootstrap.servers": s.kafka_bootstrap, "group.id": "count-" + secrets.token_hex(4)}
    )
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        total = 0
        for p in partitions:
            tp = confluent_kafka.TopicPartition(topic, p)
            low, high = consumer.get_watermark_offsets(tp, timeout=10)
            total += int(high) - int(low)
        return total
    finally:
        consumer.close()


def test_a_dry_run_lists_what_it_would_touch_and_changes_nothing(world: World) -> None:
    before = world.states()
    dry = world.http.post(
        "/api/dead-letters/retry",
        json={"filter": {"subscription": "ledger"}, "dry_run": True},
        headers=ANN,
    )
    assert dry.status_code == 200, dry.text
    found = dry.json()
    would = [(d["id"], d["outcome"]) for d in found["letters"] if d["outcome"] != "skipped"]
    assert would == [
        (world.letters.ledger_old, "would retry"),
        (world.letters.ledger_new, "would retry"),
    ]
    (poison,) = [d for d in found["letters"] if d["outcome"] == "skipped"]
    assert poison["id"] == world.letters.poison and "only be dismissed" in poison["detail"]
    first = found["letters"][0]
    assert (first["kind"], first["origin"]) == ("event-batch", "ledger")
    assert first["error"] == "drill: event 1 is marked to fail"
    assert (found["matched"], found["acted"], found["skipped"], found["operator"]) == (
        3,
        2,
        1,
        "ann",
    )
    assert world.states() == before
    assert _records(world.s, redelivery_topic("ledger", world.s.env)) == 0


def test_real_runs_touch_exactly_the_filtered_letters_each_audited_by_its_operator(
    world: World,
) -> None:
    letters = world.letters
    before = world.states()
    retried = world.http.post(
        "/api/dead-letters/retry",
        json={
            "filter": {"subscription": "ledger", "kind": "event-batch", "since": "2h"},
            "reason": "drill over",
        },
        headers=ANN,
    ).json()
    assert [(d["id"], d["outcome"]) for d in retried["letters"]] == [
        (letters.ledger_new, "retried")
    ]
    assert "redelivered to subscription ledger" in retried["letters"][0]["detail"]
    assert _records(world.s, redelivery_topic("ledger", world.s.env)) == 1

    dismissed = world.http.post(
        "/api/dead-letters/dismiss",
        json={"filter": {"kind": "command", "queue": "indexing"}, "reason": "indexer retired"},
        headers=BOB,
    ).json()
    assert [(d["id"], d["outcome"]) for d in dismissed["letters"]] == [
        (letters.indexing, "dismissed")
    ]
    after = world.states()
    assert {i for i in after if after[i] != before[i]} == {letters.ledger_new, letters.indexing}
    assert [
        (a["action"], a["who"], a["why"]) for a in world.letter(letters.ledger_new)["audit"]
    ] == [
        ("retrying", "ann", "drill over"),
        ("retried", "ann", "drill over"),
    ]
    assert [(a["action"], a["who"], a["why"]) for a in world.letter(letters.indexing)["audit"]] == [
        ("dismissed", "bob", "indexer retired")
    ]
    assert _records(world.s, queue_name("indexing", world.s.env)) == 0

    # The same call again: the letter it retried is no longer open, nothing is sent twice.
    again = world.http.post(
        "/api/dead-letters/retry",
        json={"filter": {"subscription": "ledger", "kind": "event-batch", "since": "2h"}},
        headers=BOB,
    ).json()
    assert (again["matched"], again["acted"]) == (0, 0)
    assert _records(world.s, redelivery_topic("ledger", world.s.env)) == 1


def test_the_read_token_cannot_act_in_bulk_not_even_a_dry_run(world: World) -> None:
    before = world.states()
    for path, body in (
        ("/api/dead-letters/retry", {"filter": {}}),
        ("/api/dead-letters/retry", {"filter": {}, "dry_run": True}),
        ("/api/dead-letters/dismiss", {"filter": {}, "reason": "all of them"}),
    ):
        refused = world.http.post(path, json=body, headers=READ)
        assert refused.status_code == 403, refused.text
        assert "read token" in refused.json()["reason"]
    assert world.states() == before
