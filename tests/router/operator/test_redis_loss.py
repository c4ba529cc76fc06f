"""Redis loses the environment's keys: the dead-letter index (every letter, its status, its audit)
and the operator audit logs come back from the audit topic, by the operator service at its start
and by ``rhumbatron state rebuild-index``, as the operator saw them before (real Kafka and Redis).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from consumers.runtime.audit_records import KafkaAudit
from consumers.runtime.controls import RedisAuditLog
from consumers.runtime.dead_letters import KafkaRedisDeadLetters, LetterStatus
from consumers.runtime.state_rebuild import RebuildReport, marker_key
from consumers.runtime.types import TP
from router.operator.service import OperatorService
from router.settings import Settings
from router.wiring.provisioning import provision_environment
from router.wiring.state import durable_audit, ensure_state
from router.wiring.subscription import dead_letter_actions, dead_letters, redis_client
from streams.clock import SystemClock
from streams.errors import ActionFailed
from streams.producer import Producer
from tests.support.environment import cleanup_environment, make_settings, run_cli
from tests.support.letters import Mixed, write_mixed
from tests.support.redis_loss import delete_environment_keys

pytestmark = pytest.mark.integration

LOGS = ("ledger", "pump")


@pytest.fixture
def env() -> Iterator[Settings]:
    s = make_settings()
    try:
        provision_environment(s)
        yield s
    finally:
        cleanup_environment(s)


def snapshot(s: Settings) -> dict[str, Any]:
    """What the operator service lists (each letter with its status and audit) and the logs."""
    service = OperatorService(s)
    try:
        listed = service.list_dead_letters()
        shown = {d.id: service.dead_letter(d.id).model_dump(mode="json") for d in listed.items}
        client = service.redis()
        logs = {
            slug: RedisAuditLog(client, env=s.env, slug=slug).entries(limit=1000) for slug in LOGS
        }
    finally:
        service.close()
    return {"listed": listed.model_dump(mode="json"), "letters": shown, "logs": logs}


def lose_redis(s: Settings) -> None:
    client = redis_client(s)
    try:
        assert delete_environment_keys(client, s.env) > 0
        assert dead_letters(s, client).list() == []
        assert RedisAuditLog(client, env=s.env, slug="ledger").entries() == []
    finally:
        client.close()


def rebuild_by_cli(s: Settings, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    done = run_cli(s, "state", "rebuild-index", "--json", check=True)
    assert "rebuild-index" in done.stderr  # its start line, as the other long commands
    figures: dict[str, Any] = orjson.loads(done.stdout)
    return figures


def operate(s: Settings) -> Mixed:
    """Letters of each kind, some retried, some dismissed; operator controls and the pump's
    audited move, through the commands an operator runs."""
    letters = write_mixed(s)
    service = OperatorService(s)
    try:
        service.retry(letters.ledger_new, who="ana", reason="handler fixed")
        service.retry(letters.integration, who="ana")
        service.dismiss(letters.projector, who="bo", reason="test data")
        service.dismiss(letters.poison, who="bo", reason="bad deploy")
    finally:
        service.close()
    stream = s.topology.stream_names()[0]
    producer = Producer(s.kafka_config())
    for n in range(3):
        producer.produce(stream, b"not an envelope %d" % n, key=None, partition=0)
    producer.flush(s.flush_timeout_s)
    where = ["--subscription", "ledger", "--topic", stream, "--partition", "0", "--who", "ana"]
    run_cli(
        s,
        "subscription",
        "skip-through",
        *where,
        "--offset",
        "1",
        "--reason",
        "two bad",
        check=True,
    )
    run_cli(s, "subscription", "re-reduce", *where, "--reason", "new reducer", check=True)
    return letters


def test_the_index_and_the_audit_logs_come_back_as_the_operator_saw_them(
    env: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    s = env
    letters = operate(s)
    before = snapshot(s)
    statuses = {i: d["status"] for i, d in before["letters"].items()}
    assert statuses == {
        letters.ledger_old: "open",
        letters.ledger_new: "retried",
        letters.projector: "dismissed",
        letters.poison: "dismissed",
        letters.integration: "retried",
        letters.indexing: "open",
    }
    assert [e["action"] for e in before["logs"]["ledger"]] == ["re_reduce", "skip_through"]

    # The operator service, starting on a Redis that came back empty, rebuilds before it lists.
    lose_redis(s)
    assert snapshot(s) == before
    client = redis_client(s)
    assert client.exists(marker_key(s.env))

    # The command, on a Redis that lost everything again; then once more over a whole one.
    lose_redis(s)
    figures = rebuild_by_cli(s, capsys)
    assert (figures["letters_restored"], figures["entries_restored"]) == (6, 2)
    assert snapshot(s) == before
    again = rebuild_by_cli(s, capsys)
    assert (again["letters_restored"], again["letters_updated"], again["entries_restored"]) == (
        0,
        0,
        0,
    )
    assert again["letters_kept"] == 6
    assert snapshot(s) == before

    # A letter retried after the rebuild goes out and its history goes on.
    service = OperatorService(s)
    try:
        done = service.retry(letters.ledger_old, who="cy", reason="after the loss")
        assert done.dead_letter.status == LetterStatus.RETRIED
    finally:
        service.close()
    after_retry = snapshot(s)
    lose_redis(s)
    assert snapshot(s) == after_retry


def test_two_processes_starting_on_an_empty_redis_rebuild_once(env: Settings) -> None:
    s = env
    operate(s)
    before = snapshot(s)
    lose_redis(s)
    reports: list[RebuildReport | None] = []
    barrier = threading.Barrier(2)

    def start() -> None:
        client = redis_client(s)
        barrier.wait()
        reports.append(ensure_state(s, client))
        client.close()

    threads = [threading.Thread(target=start) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rebuilt = [r for r in reports if r is not None]
    assert len(reports) == 2 and len(rebuilt) == 1  # the other found the marker
    assert rebuilt[0].letters_restored == 6
    assert snapshot(s) == before


def test_a_failed_durable_write_fails_the_action_and_leaves_redis_as_it_was(
    env: Settings,
) -> None:
    s = env
    letters = operate(s)
    before = snapshot(s)
    client = redis_client(s)
    unreachable = KafkaAudit(
        Producer({"bootstrap.servers": "127.0.0.1:1"}),
        s.kafka_config(),
        topic=durable_audit(s).topic,
        flush_timeout=1.0,
        read_timeout=1.0,
    )
    actions = dead_letter_actions(s, client, SystemClock())
    assert isinstance(actions.store, KafkaRedisDeadLetters)
    actions.store.audit = unreachable
    service = OperatorService(s, actions=actions)
    try:
        with pytest.raises(ActionFailed, match=r"audit topic rhumbatron_audit_\w+ did not take"):
            service.dismiss(letters.indexing, who="bo", reason="never")
    finally:
        service.close()

    from router.wiring.processors import load
    from router.wiring.subscription import controls

    c = controls(s, load(s, "ledger").processor, client, SystemClock())
    assert isinstance(c.audit, RedisAuditLog)
    c.audit.durable = unreachable
    tp = TP(s.topology.stream_names()[0], 0)
    cursor = c.store.load(tp).acked_through
    with pytest.raises(Exception, match="nothing was changed"):
        c.skip_through(tp, 2, who="bo", why="never")
    assert c.store.load(tp).acked_through == cursor
    assert snapshot(s) == before
    client.close()
