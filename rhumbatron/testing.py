"""Testing your code without a broker, a Redis or a database.

Processors (docs/processors.md, "Testing your processor"): ``run`` runs one over a list of events in the in-memory
world the project's own property tests use (a partitioned log, the store, dead letters, a clock
that moves only when told) and returns what it left; ``assert_exactly_once`` replays the same
events every way that must not matter (every split into polls, copies, a crash at every
fail-point, an operator's re-reduce and reprocess) and fails naming the first that changed an
effect or a fold; ``event`` builds valid events; ``subscription_settings`` what a factory (or a
class made from its settings) is given. Events reach the processor as they would in production:
upcast to the newest version of their type the catalog knows (``catalog``: the platform's by
default; give your own to test your types' upcasters).

Handlers (docs/handlers.md): ``command`` and ``context`` build a command and the context a
worker would hand it, and ``handle`` runs the handler as the worker runs it (a function, async or
not, a ``Handlers`` registry or a ``QueueHandler``). Outcomes come out as they would reach the
worker: a return means done, ``Retry``, ``Fail`` and ``MoreWork`` are raised.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, cast

from consumers.runtime import harness
from consumers.runtime.harness import EffectsDiverged, Result, event
from consumers.runtime.harness.check import CRASH_POINTS, EXHAUSTIVE_UP_TO, RANDOM_SHAPES
from consumers.runtime.types import Processor, Record
from router.settings import Settings
from router.wiring.commands import new_command
from router.wiring.processors import SubscriptionSettings
from router.workers.handlers import as_handler
from router.workers.model import Context
from streams.catalog import Catalog
from streams.clock import SystemClock
from streams.envelopes import Command, Event, encode
from streams.topology import QUEUE_PURPOSES

__all__ = [
    "EffectsDiverged",
    "Result",
    "assert_exactly_once",
    "command",
    "context",
    "event",
    "handle",
    "run",
    "subscription_settings",
]


def subscription_settings(
    slug: str, *, queues: Sequence[str] = (), env: str = "test", **table: Any
) -> SubscriptionSettings:
    """What ``rhumbatron consume`` gives a factory for ``[subscriptions.<slug>]`` holding
    ``table``, in settings of environment ``env`` that also have ``queues`` of your own."""
    settings = Settings(
        env=env, queues={name: {} for name in queues}, subscriptions={slug: dict(table)}
    )
    return SubscriptionSettings(
        slug=slug, table=settings.subscriptions[slug], settings=settings, clock=SystemClock()
    )


def _default(name: str) -> Any:
    return Settings.model_fields[name].default


# A subscription's runtime settings, at their defaults (router.settings): the harness runs a
# processor as `rhumbatron consume` would.
_POLICY = {
    "batch_size_behind": _default("batch_size_behind"),
    "retry_backoff_s": _default("batch_retry_backoff_s"),
    "retry_backoff_max_s": _default("batch_retry_backoff_max_s"),
    "max_envelope_bytes": _default("max_envelope_bytes"),
    "fold_cache_projects": _default("fold_cache_projects"),
    "fold_cache_bytes": _default("fold_cache_kbytes") * 1024,
}

ProcessorFactory = Callable[[], Processor]  # the processor's class, or any function making one


def run(
    processor: Processor | ProcessorFactory,
    events: Sequence[Event | bytes],
    *,
    batch_size: int = _default("batch_size"),
    max_batch_failures: int = _default("max_batch_failures"),
    shape: Sequence[int] = (),
    crash_at: tuple[str, int] | None = None,
    operator_move: tuple[str, int] | None = None,
    catalog: Catalog | None = None,
    from_outbox: bool = True,
) -> Result:
    """Publish ``events`` (each on its project's partition; raw bytes are a record that is no
    event, on the partition of the event before it), run ``processor`` until nothing is left to
    do, and return what it left: ``redis``, ``records``, ``applied`` (with each event's ``sql``
    and ``lines``), ``folds``, ``dead_letters``, ``cursors``.

    ``shape``: the poll sizes, in order and over again (none: ``batch_size``). ``crash_at``:
    ``(fail-point, n)``: the process dies the n-th time it passes that fail-point (the result's
    ``failpoints`` lists those a run passed) and a new one takes over; give the processor's class
    (or a function making one) rather than an instance to have the new process start with a
    fresh one, as a real restart does. ``operator_move``: ``("re_reduce" | "reprocess", k)``: once
    the first k events are consumed, an operator re-reduces every partition, or reprocesses each
    from the middle of what it acknowledged; then the rest are published. ``catalog``: the event
    types and versions the processor's code knows (the platform's when None). ``from_outbox``:
    events with a slot are sent as an outbox publisher sends them, naming one outbox, so their
    claims are kept by slot (a different event at a claimed slot is a duplicate below the
    project's base slot, a conflict above it); False: as a direct producer sends them, claimed by
    event id."""
    return harness.run(
        _factory(processor),
        events,
        shape=shape,
        crash_at=crash_at,
        operator_move=operator_move,
        policy=_policy(batch_size, max_batch_failures, catalog),
        outbox=harness.HARNESS_OUTBOX if from_outbox else None,
    )


def assert_exactly_once(
    processor: ProcessorFactory,
    events: Sequence[Event | bytes],
    *,
    exhaustive_up_to: int = EXHAUSTIVE_UP_TO,
    random_shapes: int = RANDOM_SHAPES,
    crash_points: int = CRASH_POINTS,
    seed: int = 0,
    batch_size: int = _default("batch_size"),
    max_batch_failures: int = _default("max_batch_failures"),
    catalog: Catalog | None = None,
) -> Result:
    """Replay ``events``, each time with a fresh processor from ``processor`` (its class, or a
    function making one): split into every sequence of polls when there are at most
    ``exhaustive_up_to`` of them (else polls of every size up to that), with a crash at every
    fail-point it passes, with an operator's re-reduce and reprocess halfway, and in
    ``random_shapes`` random splits (``seed``), some with copies of events published again.
    Each must leave the effects and folds of one clean run, every effect applied once; else
    :class:`EffectsDiverged` says which replay differed, where, and the ``run`` call that
    replays it. ``catalog`` as for :func:`run`. Returns the clean run."""
    if not isinstance(processor, type) and hasattr(processor, "process"):
        raise TypeError(
            f"assert_exactly_once takes the processor's class or a function making one, not an "
            f"instance ({type(processor).__name__}): every replay starts a fresh processor, as "
            "a restarted process does"
        )
    return harness.assert_exactly_once(
        processor,
        events,
        exhaustive_up_to=exhaustive_up_to,
        random_shapes=random_shapes,
        crash_points=crash_points,
        seed=seed,
        policy=_policy(batch_size, max_batch_failures, catalog),
    )


def _factory(processor: Processor | ProcessorFactory) -> ProcessorFactory:
    # A class is a factory, though it has every attribute of the contract an instance has.
    if isinstance(processor, type) or not hasattr(processor, "process"):
        return cast(ProcessorFactory, processor)
    instance = cast(Processor, processor)
    return lambda: instance


def _policy(batch_size: int, max_batch_failures: int, catalog: Catalog | None) -> dict[str, Any]:
    policy = {**_POLICY, "batch_size": batch_size, "max_batch_failures": max_batch_failures}
    return policy if catalog is None else {**policy, "catalog": catalog}


def command(
    command_type: str,
    *,
    command_id: str = "cmd_test",
    project_id: str = "project-1",
    change_id: str = "change-1",
    task_id: str = "task-1",
    payload: dict[str, Any] | None = None,
    deadline_s: float | None = 3600.0,
    now: datetime | None = None,
) -> Command:
    """A valid command (checked as the wire checks it)."""
    return new_command(
        command_type,
        project_id,
        payload=payload,
        command_id=command_id,
        change_id=change_id,
        task_id=task_id,
        deadline_s=deadline_s,
        now=now,
    )


def context(
    cmd: Command,
    *,
    queue: str,
    attempt: int = 1,
    max_attempts: int = 4,
    max_deliveries: int = 4,
    now: datetime | None = None,
    queues: Sequence[str] | None = None,
) -> Context:
    """The context of one delivery of ``cmd`` on ``queue``; ``ctx.send`` takes ``queues`` (by
    default the built-in ones and ``queue``), as a worker's takes the settings' queues."""
    record = Record(
        topic=f"rhumbatron-{queue}-test",
        partition=0,
        offset=0,
        key=cmd.project_id.encode(),
        value=encode(cmd, max_bytes=1 << 20),
        headers=(),
    )
    return Context(
        queue=queue,
        attempt=attempt,
        attempts=max_attempts,
        max_deliveries=max_deliveries,
        record=record,
        now=now or datetime.now(UTC),
        command=cmd,
        queues=tuple(dict.fromkeys([*(QUEUE_PURPOSES if queues is None else queues), queue])),
    )


def handle(handler: object, cmd: Command, ctx: Context) -> None:
    """Runs ``handler`` on one delivery, as the worker would."""
    as_handler(handler, getattr(handler, "__qualname__", repr(handler))).handle(cmd, ctx)
