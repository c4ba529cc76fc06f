"""What ``process`` returns is checked before anything of it is applied: something that is not
``Effects``, effects another kind of processor has, or a Redis op the stores do not have fails
the event as a raise would (retried, then dead-lettered naming what was wrong); the consumer
neither crashes nor stops, and the project's other events and other projects go on."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest

from consumers.runtime.types import BaseProcessor, Delivery, EffectKind, Effects, OutRecord, RedisOp
from streams.envelopes import Event
from tests.support.runtime_harness import World, event


class Returns(BaseProcessor):
    slug: ClassVar[str] = "returns"

    def __init__(self, wrong: Any) -> None:
        self.wrong = wrong

    def process(self, event: Event, state: Any, delivery: Delivery) -> Effects:
        if event.project_id == "alpha" and event.slot == 1:
            return self.wrong  # type: ignore[no-any-return]
        return Effects(redis=[RedisOp("HINCRBY", "n", (event.project_id, 1))])


@pytest.mark.parametrize(
    ("wrong", "reason"),
    [
        (None, "process must return Effects, got NoneType"),
        (Effects(redis=[RedisOp("EVAL", "k", ("x",))]), "not a Redis op of DEL, HDEL"),
        (
            Effects(records=[OutRecord("out", "k", b"{}", "r1")]),
            "effect kind 'redis' returned records",
        ),
    ],
)
def test_a_wrong_return_fails_its_event_and_nothing_else(wrong: Any, reason: str) -> None:
    w = World()
    for project in ("alpha", "gamma"):
        for n in (1, 2):
            w.publish(event(project, n))
    runner = w.runner(Returns(wrong))
    w.drain(runner)
    [letter] = w.dead.list()
    assert reason in letter.error and letter.attempts == 5
    assert [e.event_id for e in letter.entries] == [event("alpha", 1).event_id]
    counts: dict[str, int] = {}
    for project in ("alpha", "gamma"):
        got = w.store.read(w.tp_of(project), "n") or {}
        assert isinstance(got, dict)
        counts.update({k: int(v) for k, v in got.items()})
    assert counts == {"alpha": 1, "gamma": 2}  # alpha's second event went on after the letter


def test_a_sql_processor_returning_redis_ops_is_refused_the_same_way() -> None:
    from consumers.runtime.runner import _wrong_effects

    assert _wrong_effects(Effects(redis=[RedisOp("SET", "k", ("v",))]), EffectKind.SQL) == (
        "a processor of effect kind 'sql' returned redis effects"
    )
    assert _wrong_effects(Effects(), EffectKind.SQL) is None
