"""A command worker killed (SIGKILL) around its transaction: attempts stay exact — one retry
record per failed attempt, never a second; completed commands are not run again."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import cast

import orjson
import pytest

from consumers.redis_conn import connect
from router.settings import Settings
from router.wiring.workers import provision_queues
from router.workers.drills import read_drill
from streams.envelopes import decode_command
from streams.headers import ATTEMPT
from streams.topology import retry_topic
from tests.support.kafka import read_all
from tests.support.workers import (
    QUEUE,
    commands,
    finish,
    send,
    settings_factory,
    short_queues,
    start_worker,
)

pytestmark = [pytest.mark.integration, pytest.mark.chaos]


@pytest.fixture
def make(tmp_path: Path) -> Iterator[Callable[..., Settings]]:
    yield from settings_factory(tmp_path)


@pytest.mark.parametrize(
    "failpoint", ["worker.before_transaction_commit", "worker.after_transaction_commit"]
)
def test_a_worker_killed_around_its_transaction_keeps_attempts_exact(
    make: Callable[..., Settings], failpoint: str
) -> None:
    s = make(queues=short_queues(1.0))
    provision_queues(s, [QUEUE])
    flaky = commands(3, "f", drill="fail-once")
    fine = commands(7, "k")
    send(s, flaky + fine)  # one batch of 10
    killed = start_worker(s, "worker", "--queue", QUEUE, "--handler", "drill", failpoints=failpoint)
    killed.communicate(timeout=120)
    assert killed.returncode == -9
    # The restarted worker outlives the killed one's open transaction (transaction_timeout_ms),
    # which holds back read_committed readers of the retry partition until the broker aborts it.
    idle = str(s.transaction_timeout_ms / 1000 + 4)
    stats = finish(
        start_worker(s, "worker", "--queue", QUEUE, "--handler", "drill", "--until-idle", idle)
    )
    drill = read_drill(connect(s.redis_url, timeout=5), s.env, QUEUE)
    assert drill["ok"] == {
        **{c.command_id: 2 for c in flaky},
        **{c.command_id: 1 for c in fine},
    }
    for c in fine:
        assert drill["runs"][c.command_id] == 1  # completed before the kill: not run again
    first_attempt_runs = 2 if failpoint == "worker.before_transaction_commit" else 1
    for c in flaky:
        assert drill["runs"][c.command_id] == first_attempt_runs + 1
    seen = _retried(s, expect=4)
    assert seen == [(c.command_id, b"2") for c in flaky]  # exactly one retry record each
    assert stats.get("dead_lettered", 0) == 0


@pytest.mark.slow
@pytest.mark.parametrize("ordered", [False, True], ids=["unordered", "ordered"])
@pytest.mark.parametrize(
    "failpoint", ["worker.before_transaction_commit@2", "worker.after_transaction_commit@2"]
)
def test_a_worker_killed_with_64_commands_in_flight_keeps_attempts_exact(
    make: Callable[..., Settings], failpoint: str, ordered: bool
) -> None:
    """On an ordered queue too (its seven projects side by side, each in order), where the
    failed attempts are kept in the worker: none reaches the retry topic."""
    queues = short_queues(1.0)
    queues[QUEUE] = queues[QUEUE].model_copy(
        update={"max_in_flight": 64, "batch": 16, "ordered": ordered}
    )
    s = make(queues=queues)
    provision_queues(s, [QUEUE])
    flaky = commands(20, "f", drill="fail-once")
    fine = commands(180, "k")
    send(s, flaky[:10] + fine + flaky[10:])
    killed = start_worker(s, "worker", "--queue", QUEUE, "--handler", "drill", failpoints=failpoint)
    killed.communicate(timeout=120)
    assert killed.returncode == -9
    idle = str(s.transaction_timeout_ms / 1000 + 4)
    stats = finish(
        start_worker(s, "worker", "--queue", QUEUE, "--handler", "drill", "--until-idle", idle)
    )
    drill = read_drill(connect(s.redis_url, timeout=5), s.env, QUEUE)
    # Runs started beside the killed transaction may run again (side effects are at least
    # once); what each command ended as, and the retries sent, are exact.
    assert drill["ok"] == {
        **{c.command_id: 2 for c in flaky},
        **{c.command_id: 1 for c in fine},
    }
    if ordered:
        assert _retried(s, expect=1) == []  # read for its whole timeout: nothing comes
    else:
        seen = _retried(s, expect=21)
        assert seen == sorted((c.command_id, b"2") for c in flaky)  # one retry record each
    assert stats.get("dead_lettered", 0) == 0


def _retried(s: Settings, *, expect: int) -> list[tuple[str, bytes]]:
    """(command id, attempt) of every record on the queue's retry topic, sorted."""
    retries = read_all(s.kafka_bootstrap, [retry_topic(QUEUE, s.env)], expect=expect, timeout=10)
    return sorted(
        (
            decode_command(m.value(), max_bytes=s.max_envelope_bytes).command_id,
            dict(cast(list[tuple[str, bytes]], m.headers() or []))[ATTEMPT],
        )
        for m in retries
    )


@pytest.mark.slow
def test_an_ordered_queue_killed_while_a_project_waits_goes_on_in_order(
    make: Callable[..., Settings], tmp_path: Path
) -> None:
    """Killed after the commit that kept a failed command (and its project's later ones) in
    the worker: the next worker reads them back from the group's offset metadata, runs attempt
    2 after its delay, then the project's later commands, in order; no retry topic is used."""
    queues = short_queues(1.0)
    queues[QUEUE] = queues[QUEUE].model_copy(update={"ordered": True})
    s = make(queues=queues)
    provision_queues(s, [QUEUE])
    later = commands(1, "l", mode="later")
    done = commands(4, "d")
    ordered = [c.model_copy(update={"project_id": "proj-one"}) for c in later + done]
    send(s, ordered)
    journal = tmp_path / "journal.ndjson"
    handler = ("worker", "--queue", QUEUE, "--handler", "tests.support.team_handlers:handlers")
    killed = start_worker(
        s, *handler, failpoints="worker.after_transaction_commit", journal=journal
    )
    killed.communicate(timeout=120)
    assert killed.returncode == -9
    idle = str(s.transaction_timeout_ms / 1000 + 4)
    stats = finish(start_worker(s, *handler, "--until-idle", idle, journal=journal))
    runs = [orjson.loads(line) for line in journal.read_text().splitlines()]
    assert [(r["id"], r["attempt"]) for r in runs] == [
        (ordered[0].command_id, 1),
        (ordered[0].command_id, 2),
        *((c.command_id, 1) for c in ordered[1:]),
    ]
    assert stats["ok"] == 5
    assert _retried(s, expect=1) == []  # read for its whole timeout: nothing comes
