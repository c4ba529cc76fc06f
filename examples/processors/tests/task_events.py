"""Task events as the team's service publishes them."""

from __future__ import annotations

from rhumbatron import Event
from rhumbatron.testing import event


def lifecycle(project: str, task: str, outcome: str, *, first_slot: int) -> list[Event]:
    """A task's three events: created, started, then ``task.<outcome>``."""
    kinds = ["task.created", "task.started", f"task.{outcome}"]
    payloads: list[dict[str, object]] = [{}, {"agent": "agent-1"}, {}]
    if outcome == "failed":
        payloads[2] = {"reason": "tests failed"}
    return [
        event(kind, project, slot=first_slot + n, task_id=task, payload=payload)
        for n, (kind, payload) in enumerate(zip(kinds, payloads, strict=True))
    ]
