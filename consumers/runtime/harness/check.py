"""The exactly-once check: the same events replayed many ways must leave the same effects and
folds as one clean run, each effect applied once.

The ways (each a :class:`Trial`, which a failure names so it can be replayed):

- every split of the log into polls when it is short (``exhaustive_up_to`` records or fewer),
  else every constant poll size up to that;
- a crash at every fail-point the run passes, at every pass (polls of one record, and polls of
  the policy's batch size), a new process taking over;
- an operator's re-reduce, and a reprocess from the middle of each partition, between the two
  halves of the log;
- random splits, some with copies of events published again (right behind, or later), as a
  publisher's crash window makes them.

A trial is compared with the clean run (polls of the policy's batch size) of the same log and
the same operator move: Redis data, Kafka records, each project's applied events with their SQL
statements and file lines, folds, dead-lettered events and cursors. A log with copies is also
compared, in what its events did (folds, which events applied at which revision, which were
dead-lettered), with the clean run of the log without them: a copy changes nothing. A processor
whose effects depend on anything but its event, its fold and its delivery (what it counted in
memory, the batch it came in) fails here.
"""

from __future__ import annotations

import itertools
import random
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from consumers.runtime.harness.result import Result
from consumers.runtime.harness.run import OPERATOR_MOVES, run
from consumers.runtime.types import Processor
from streams.envelopes import Event
from streams.errors import EffectsDiverged

EXHAUSTIVE_UP_TO = 6  # 2**5 = 32 splits of a log of six records
RANDOM_SHAPES = 50
# Crashes tried per poll shape, at most: a longer run's fail-point passes are sampled (with the
# seed), its first and last passes of each fail-point always among them.
CRASH_POINTS = 100
MAX_COPIES = 3
# How much of a value a failure message shows.
SHOWN_CHARS = 300


@dataclass(frozen=True)
class Trial:
    """One replay of the log: ``run``'s arguments, and the order of the events published (indices
    into them, a repeat being a copy; None: as given)."""

    shape: tuple[int, ...] = ()
    order: tuple[int, ...] | None = None
    crash_at: tuple[str, int] | None = None
    operator_move: tuple[str, int] | None = None

    def log(self, events: Sequence[Event | bytes]) -> list[Event | bytes]:
        return list(events) if self.order is None else [events[i] for i in self.order]

    def call(self) -> str:
        """The call that replays it."""
        log = "events" if self.order is None else f"[events[i] for i in {self.order}]"
        args = [f"run(processor, {log}"]
        if self.shape:
            args.append(f"shape={self.shape}")
        if self.crash_at is not None:
            args.append(f"crash_at={self.crash_at}")
        if self.operator_move is not None:
            args.append(f"operator_move={self.operator_move}")
        return ", ".join(args) + ")"

    def __str__(self) -> str:
        said = [_polls(self.shape)]
        if self.order is not None:
            said.append("copies of events published again")
        if self.crash_at is not None:
            said.append(f"a crash at pass {self.crash_at[1]} of {self.crash_at[0]}")
        if self.operator_move is not None:
            move, after = self.operator_move
            said.append(f"a {move.replace('_', '-')} after the first {after} events")
        return ", ".join(said)


def _polls(shape: tuple[int, ...]) -> str:
    if not shape:
        return "polls of the batch size"
    if len(shape) == 1:
        return f"polls of {shape[0]} record{'s' if shape[0] > 1 else ''}"
    return f"polls of {', '.join(map(str, shape))} records in turn"


def assert_exactly_once(
    factory: Callable[[], Processor],
    events: Sequence[Event | bytes],
    *,
    exhaustive_up_to: int = EXHAUSTIVE_UP_TO,
    random_shapes: int = RANDOM_SHAPES,
    crash_points: int = CRASH_POINTS,
    seed: int = 0,
    policy: Mapping[str, Any] | None = None,
) -> Result:
    """Replay ``events`` every way the module's docstring lists, each with a fresh processor from
    ``factory``; raise :class:`EffectsDiverged` naming the first trial whose effects or folds
    differ from the clean run's, or that applied an effect twice. Returns the clean run."""
    checker = _Checker(factory, events, policy or {})
    rng = random.Random(seed)
    for trial in plan(len(events), exhaustive_up_to=exhaustive_up_to, moves=True):
        checker.check(trial)
    for shape in ((1,), ()):
        for point in _crash_points(checker.result(Trial(shape)).failpoints, crash_points, rng):
            checker.check(Trial(shape, crash_at=point))
    for trial in random_trials(events, random_shapes, rng):
        checker.check(trial)
    return checker.result(Trial())


def plan(length: int, *, exhaustive_up_to: int, moves: bool) -> list[Trial]:
    """The trials every check makes of a log of ``length`` records, before crashes and random
    shapes."""
    if length <= exhaustive_up_to:
        shapes = [tuple(c) for c in _compositions(length)]
    else:
        shapes = [(size,) for size in range(1, exhaustive_up_to + 1)]
    trials = [Trial(shape) for shape in shapes]
    if moves:
        half = length // 2
        trials += [
            Trial(shape, operator_move=(move, half))
            for move in OPERATOR_MOVES
            for shape in ((1,), (2, 1))
        ]
    return trials


def random_trials(
    events: Sequence[Event | bytes], count: int, rng: random.Random
) -> Iterator[Trial]:
    """``count`` random splits; about half of them over a log with copies of events."""
    for _ in range(count):
        order: tuple[int, ...] | None = None
        originals = [i for i, e in enumerate(events) if isinstance(e, Event)]
        if originals and rng.random() < 0.5:
            placed = list(range(len(events)))
            for _ in range(rng.randint(1, MAX_COPIES)):
                original = rng.choice(originals)
                after = placed.index(original)
                placed.insert(rng.randint(after + 1, len(placed)), original)
            order = tuple(placed)
        length = len(events) if order is None else len(order)
        yield Trial(_random_shape(length, rng), order=order)


def _compositions(n: int) -> Iterator[list[int]]:
    """Every split of n records into polls, in order: 2**(n-1) of them."""
    if n == 0:
        yield []
        return
    for cuts in itertools.product((False, True), repeat=n - 1):
        sizes, size = [], 1
        for cut in cuts:
            if cut:
                sizes.append(size)
                size = 1
            else:
                size += 1
        yield [*sizes, size]


def _random_shape(length: int, rng: random.Random) -> tuple[int, ...]:
    top = rng.randint(1, max(length, 1))
    shape: list[int] = []
    while sum(shape) < length:
        shape.append(rng.randint(1, top))
    return tuple(shape) or (1,)


def _crash_points(
    failpoints: Mapping[str, int], most: int, rng: random.Random
) -> list[tuple[str, int]]:
    points = [(name, n) for name, passes in failpoints.items() for n in range(1, passes + 1)]
    if most <= 0:
        return []
    if len(points) <= most:
        return points
    ends = {(name, n) for name, passes in failpoints.items() for n in (1, passes)}
    rest = sorted(set(points) - ends)
    return sorted(ends | set(rng.sample(rest, max(most - len(ends), 0))))


class _Checker:
    def __init__(
        self,
        factory: Callable[[], Processor],
        events: Sequence[Event | bytes],
        policy: Mapping[str, Any],
    ) -> None:
        self.factory = factory
        self.events = events
        self.policy = policy
        made = factory()
        self.slug = made.slug or type(made).__name__
        self.results: dict[Trial, Result] = {}

    def result(self, trial: Trial) -> Result:
        found = self.results.get(trial)
        if found is None:
            found = self.results[trial] = run(
                self.factory,
                trial.log(self.events),
                shape=trial.shape,
                crash_at=trial.crash_at,
                operator_move=trial.operator_move,
                policy=self.policy,
            )
        return found

    def check(self, trial: Trial) -> None:
        got = self.result(trial)
        twice = _applied_twice(got)
        if twice is not None:
            raise self._diverged(trial, "exactly once", twice)
        clean = Trial(order=trial.order, operator_move=trial.operator_move)
        want = self.result(clean)
        twice = _applied_twice(want)
        if twice is not None:
            raise self._diverged(clean, "exactly once", twice)
        found = _first_difference(_effects(got), _effects(want))
        if found is not None:
            raise self._diverged(trial, *found, clean=clean)
        if trial.order is not None:
            clean = Trial(operator_move=trial.operator_move)
            found = _first_difference(_what_events_did(got), _what_events_did(self.result(clean)))
            if found is not None:
                raise self._diverged(trial, *found, clean=clean)

    def _diverged(
        self, trial: Trial, aspect: str, detail: str, *, clean: Trial | None = None
    ) -> EffectsDiverged:
        lines = [
            f"{self.slug}: not exactly once with {trial}:",
            f"  {detail}",
            f"  replay: {trial.call()}",
        ]
        if clean is not None:
            lines.append(f"  against the clean run: {clean.call()}")
        return EffectsDiverged("\n".join(lines), trial, aspect)


def _applied_twice(result: Result) -> str | None:
    applied = Counter((a.event_id, a.cursor_revision) for a in result.applied)
    for (event_id, revision), n in applied.items():
        if n > 1:
            return f"event {event_id} applied {n} times at cursor revision {revision}"
    records = Counter(r.record_id for r in result.records)
    for record_id, n in records.items():
        if n > 1:
            return f"Kafka record {record_id} produced {n} times"
    return None


def _per_project(result: Result, *, effects: bool) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for a in result.applied:
        row = (a.event_id, a.cursor_revision, a.sql, a.lines) if effects else a.event_id
        out.setdefault(a.project_id, []).append(row)
    return dict(sorted(out.items()))


def _letters(result: Result, *, values: bool) -> list[Any]:
    return sorted(
        (d.event_id or "", (d.value or b"") if values and d.event_id is None else b"")
        for d in result.dead_letters
    )


def _effects(result: Result) -> dict[str, Any]:
    """Everything a trial must leave as the clean run of the same log did, by the result's
    field names: Kafka records in any order, applied events (with their statements and lines)
    per project in order."""
    return {
        "folds": result.folds,
        "redis": {str(tp): data for tp, data in result.redis.items()},
        "records": sorted(result.records, key=lambda r: (r.topic, r.key, r.record_id)),
        "applied": _per_project(result, effects=True),
        "dead_letters": _letters(result, values=True),
        "cursors": {str(tp): cursor for tp, cursor in result.cursors.items()},
        "caught_up_calls": result.caught_up_calls,
    }


def _what_events_did(result: Result) -> dict[str, Any]:
    """What a copy of an event must not change (the offsets it takes may change the rest)."""
    return {
        "folds": result.folds,
        "applied": _per_project(result, effects=False),
        "dead_letters": [e for e, _ in _letters(result, values=False) if e],
    }


def _first_difference(got: dict[str, Any], want: dict[str, Any]) -> tuple[str, str] | None:
    for aspect, value in got.items():
        if value != want[aspect]:
            return aspect, _where(value, want[aspect], aspect)
    return None


def _where(got: Any, want: Any, path: str) -> str:
    """Where two values first differ, and how."""
    if isinstance(got, dict) and isinstance(want, dict):
        for key in sorted(set(got) | set(want), key=repr):
            here = f"{path}[{key!r}]"
            if key not in want:
                return f"{here} = {_shown(got[key])} (the clean run has none)"
            if key not in got:
                return f"{here} missing (the clean run has {_shown(want[key])})"
            if got[key] != want[key]:
                return _where(got[key], want[key], here)
    if isinstance(got, list | tuple) and isinstance(want, list | tuple):
        for i, (g, w) in enumerate(zip(got, want, strict=False)):
            if g != w:
                return _where(g, w, f"{path}[{i}]")
        if len(got) != len(want):
            return f"{path}: {len(got)} items, the clean run {len(want)}: got {_shown(got)}"
    return f"{path or 'value'}: got {_shown(got)}, the clean run {_shown(want)}"


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS] + "…"
