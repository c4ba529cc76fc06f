"""Processors of a team's own, as the tests load them: by path, by a settings table, or through
a factory with its own settings model; and the ways one can be wrong."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from rhumbatron import (
    Delivery,
    EffectKind,
    Effects,
    Event,
    Processor,
    RedisOp,
    SqlStatement,
    SubscriptionSettings,
)


class TaskCounts(Processor):
    """Counts completed tasks per project; fails every time on a ``drill: fail`` payload."""

    slug: ClassVar[str] = "task-counts"
    consumes: ClassVar[frozenset[str] | None] = frozenset({"task.completed"})
    effect_kind: ClassVar[EffectKind] = EffectKind.REDIS

    def process(self, event: Event, state: Any, delivery: Delivery) -> Effects:
        if event.payload.get("drill") == "fail":
            raise RuntimeError(f"drill: {event.event_id} fails")
        return Effects(redis=[RedisOp("HINCRBY", "done", (event.project_id, 1))])


class WindowOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    window: int = Field(ge=1)
    label: str = "tasks"


class Windowed(Processor):
    slug: ClassVar[str] = "windowed"
    effect_kind: ClassVar[EffectKind] = EffectKind.REDIS

    def __init__(self, options: WindowOptions) -> None:
        self.options = options

    def process(self, event: Event, state: Any, delivery: Delivery) -> Effects:
        return Effects(redis=[RedisOp("INCRBY", self.options.label, (1,))])


def windowed(settings: SubscriptionSettings) -> Processor:
    """A factory: its options come from [subscriptions.windowed]."""
    return Windowed(settings.options(WindowOptions))


class BadSlug(TaskCounts):
    slug: ClassVar[str] = "Bad_Slug"


class Stolen(TaskCounts):
    slug: ClassVar[str] = "ledger"


class WrongKind(TaskCounts):
    slug: ClassVar[str] = "wrong-kind"
    effect_kind = "redis"  # type: ignore[assignment]


class NotOne:
    slug = "not-one"


class Labelled(Processor):
    """Made from its settings: a class whose constructor takes them is its own factory."""

    slug: ClassVar[str] = "labelled"
    effect_kind: ClassVar[EffectKind] = EffectKind.REDIS

    def __init__(self, settings: SubscriptionSettings) -> None:
        self.label = settings.options(WindowOptions).label

    def process(self, event: Event, state: Any, delivery: Delivery) -> Effects:
        return Effects(redis=[RedisOp("INCRBY", self.label, (1,))])


def failing_factory(settings: SubscriptionSettings) -> Processor:
    raise RuntimeError("no database configured")


LIST_NOT_A_FACTORY = [1, 2]


class Notes(Processor):
    """A SQL-effect subscription of your own: one row per event."""

    slug: ClassVar[str] = "notes"
    effect_kind: ClassVar[EffectKind] = EffectKind.SQL

    def process(self, event: Event, state: Any, delivery: Delivery) -> Effects:
        insert = SqlStatement(
            "INSERT INTO notes (id, project) VALUES (%s, %s) ON CONFLICT (id) DO NOTHING",
            (event.event_id, event.project_id),
        )
        return Effects(sql=[insert])
