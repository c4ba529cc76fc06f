"""The external-call pair: acme-failure-alerts emits an ``alert.notify`` command per failed
task onto the team's ``notifications`` queue, and the handler acme-notify makes the call."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from acme_processors.alerts import COMMAND_TYPE, FailureAlerts
from acme_processors.notify import notify
from acme_processors.service import JOURNAL_VARIABLE
from task_events import lifecycle

from rhumbatron import (
    Command,
    Delivery,
    Effects,
    Event,
    Fail,
    OutRecord,
    Retry,
    SubscriptionSettings,
)
from rhumbatron.testing import assert_exactly_once, command, context, handle, run

Make = Callable[..., SubscriptionSettings]

EVENTS = [
    *lifecycle("acme-web", "t1", "failed", first_slot=1),
    *lifecycle("acme-api", "t2", "completed", first_slot=1),
    *lifecycle("acme-web", "t3", "failed", first_slot=4),
    *lifecycle("acme-api", "t4", "failed", first_slot=4),
]
FAILED = [e for e in EVENTS if e.event_type == "task.failed"]


@pytest.fixture
def alerts(subscription_settings: Make) -> Callable[[], FailureAlerts]:
    settings = subscription_settings(FailureAlerts.slug)
    return lambda: FailureAlerts(settings)


def commands_of(records: list[OutRecord]) -> dict[str, Command]:
    """The commands the records carry, by the task they alert about."""
    commands = [Command.model_validate_json(record.value) for record in records]
    return {c.task_id or "": c for c in commands}


def test_one_command_per_failed_task_on_the_notifications_queue(
    alerts: Callable[[], FailureAlerts],
) -> None:
    result = run(alerts, EVENTS)
    assert {r.topic for r in result.records} == {"rhumbatron-notifications-test"}
    sent = commands_of(result.records)
    assert sorted(sent) == ["t1", "t3", "t4"]
    assert sent["t3"].command_type == COMMAND_TYPE
    assert sent["t3"].payload["text"] == "task t3 of acme-web failed: tests failed"
    # Made at the event's time, so every try of the event makes the very same record.
    assert sent["t3"].created_at == FAILED[1].timestamp
    assert all(
        r.record_id == c.command_id for r, c in zip(result.records, sent.values(), strict=True)
    )
    assert all(c.command_id.startswith("cmd_idk_") for c in sent.values())


def test_a_crash_retry_makes_the_same_commands(subscription_settings: Make) -> None:
    settings = subscription_settings(FailureAlerts.slug)
    processed: list[str] = []

    class Counted(FailureAlerts):
        def process(
            self, event: Event, state: dict[str, Any] | None, delivery: Delivery
        ) -> Effects:
            processed.append(event.event_id)
            return super().process(event, state, delivery)

    clean = run(lambda: Counted(settings), EVENTS, shape=(1,))
    retried = 0
    for point in ("runtime.before_store_commit", "runtime.before_transaction_commit"):
        for n in range(1, clean.failpoints[point] + 1):
            processed.clear()
            # The process dies before its commit; the next one reads the events again and
            # processes them again.
            crashed = run(lambda: Counted(settings), EVENTS, shape=(1,), crash_at=(point, n))
            assert crashed.records == clean.records, f"a crash at pass {n} of {point}"
            retried += len(processed) > len(FAILED)
    assert retried, "no crash made a failed task's command twice"


def test_a_reprocess_makes_new_commands(alerts: Callable[[], FailureAlerts]) -> None:
    events = [
        *lifecycle("acme-web", "t1", "failed", first_slot=1),
        *lifecycle("acme-web", "t2", "failed", first_slot=4),
    ]
    failed = [e for e in events if e.event_type == "task.failed"]
    result = run(alerts, events, operator_move=("reprocess", len(events)))
    ids_per_event: dict[str, set[str]] = {}
    for record in result.records:
        event_id = json.loads(record.value)["payload"]["eventId"]
        ids_per_event.setdefault(event_id, set()).add(record.record_id)
    runs = Counter(a.event_id for a in result.applied)
    # A failed task applied again by the reprocess is alerted about again, under a new id: "do
    # it again" is what a reprocess asks.
    assert {e: len(ids) for e, ids in ids_per_event.items()} == {
        e.event_id: runs[e.event_id] for e in failed
    }
    assert [runs[e.event_id] for e in failed] == [1, 2]


def test_exactly_once_whatever_happens(alerts: Callable[[], FailureAlerts]) -> None:
    assert_exactly_once(alerts, EVENTS)


def test_a_queue_the_settings_do_not_have_is_refused_at_start(subscription_settings: Make) -> None:
    with pytest.raises(Exception, match="pagers"):
        FailureAlerts(subscription_settings(FailureAlerts.slug, queue="pagers"))


@pytest.fixture
def journal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "alerts.ndjson"
    monkeypatch.setenv(JOURNAL_VARIABLE, str(path))
    return path


def sent(journal: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in journal.read_text().splitlines()]


def test_the_handler_calls_the_service_once_per_command(
    alerts: Callable[[], FailureAlerts], journal: Path
) -> None:
    for cmd in commands_of(run(alerts, EVENTS).records).values():
        handle(notify, cmd, context(cmd, queue="notifications"))
        # The worker's re-run after a crash before its commit: the same key, nothing sent.
        handle(notify, cmd, context(cmd, queue="notifications"))
    assert sorted((line["task"], line["text"]) for line in sent(journal)) == [
        ("t1", "task t1 of acme-web failed: tests failed"),
        ("t3", "task t3 of acme-web failed: tests failed"),
        ("t4", "task t4 of acme-api failed: tests failed"),
    ]
    assert len({line["key"] for line in sent(journal)}) == 3


def test_no_service_configured_is_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(JOURNAL_VARIABLE, raising=False)
    cmd = command(COMMAND_TYPE, payload={"text": "task t1 failed"})
    with pytest.raises(Retry, match=JOURNAL_VARIABLE):
        handle(notify, cmd, context(cmd, queue="notifications"))


def test_a_command_without_text_fails_for_good(journal: Path) -> None:
    cmd = command(COMMAND_TYPE, payload={})
    with pytest.raises(Fail, match="no text"):
        handle(notify, cmd, context(cmd, queue="notifications"))
    assert not journal.exists()
