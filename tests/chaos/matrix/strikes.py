"""A row's faults, one or several at once (``Scenario.strikes``): each fault is injected by the
injector of its kind, as if it were the row's only one, and :class:`Strikes` drives them
together behind the one injector's interface the runner uses.

Faults of faults.py take the ``Injector`` there; the server and network faults take theirs from
server_faults.py.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path

from router.settings import Settings
from streams.envelopes import Draft
from tests.chaos.matrix import faults, server_faults
from tests.chaos.matrix.moves import Operator
from tests.chaos.matrix.pipeline import Pipeline
from tests.chaos.matrix.scenarios import Scenario
from tests.support import hostile
from tests.support.infra import PrivateServices


def each(scenario: Scenario) -> list[Scenario]:
    """The row once per fault, each with that fault and its moment only."""
    if not isinstance(scenario.fault, tuple) and not isinstance(scenario.when, tuple):
        return [scenario]
    return [dataclasses.replace(scenario, fault=f, when=w) for f, w in scenario.strikes()]


def armed(scenario: Scenario) -> dict[str, dict[str, str]]:
    """The extra environment of each member's first start, every fault's together."""
    out: dict[str, dict[str, str]] = {}
    for one in each(scenario):
        for role, env in (*faults.armed(one).items(), *server_faults.armed(one).items()):
            assert not set(env) & set(out.get(role, {})), f"{scenario.name}: {role} armed twice"
            out.setdefault(role, {}).update(env)
    return out


def poisoned(scenario: Scenario, drafts: Sequence[Draft]) -> tuple[list[Draft], list[str]]:
    """The workload with every fault's poison events marked, and their ids."""
    out, ids = list(drafts), []
    for one in each(scenario):
        out, marked = faults.poisoned(one, out)
        ids += marked
    return out, ids


class Strikes:
    """Several injectors as one: it heals once all have healed, and says each one's problems."""

    def __init__(self, parts: list[faults.Injector]) -> None:
        self.parts = parts

    @property
    def healing(self) -> bool:
        return any(p.healing for p in self.parts)

    @property
    def struck_at(self) -> float | None:
        struck = [p.struck_at for p in self.parts if p.struck_at is not None]
        return min(struck) if struck else None

    @property
    def healed_at(self) -> float | None:
        healed = [p.healed_at for p in self.parts if p.healed_at is not None]
        return max(healed) if healed else None

    @property
    def at_strike(self) -> dict[str, int]:
        first = min(
            (p for p in self.parts if p.struck_at is not None),
            key=lambda p: p.struck_at or 0.0,
            default=None,
        )
        return first.at_strike if first is not None else {}

    @property
    def notes(self) -> dict[str, object]:
        out: dict[str, object] = {}
        for part in self.parts:
            out.update(getattr(part, "notes", {}))
        return out

    @property
    def garbage(self) -> dict[tuple[str, int, int], hostile.Hostile]:
        out: dict[tuple[str, int, int], hostile.Hostile] = {}
        for part in self.parts:
            out.update(part.garbage)
        return out

    @property
    def operator(self) -> Operator | None:
        return next((p.operator for p in self.parts if p.operator is not None), None)

    def poll(self) -> None:
        for part in self.parts:
            part.poll()

    def wait_healed(self, timeout: float) -> None:
        for part in self.parts:
            part.wait_healed(timeout)

    def problems(self) -> list[str]:
        return [p for part in self.parts for p in part.problems()]

    def check_after(self, problems: dict[str, list[str]], poison: list[str], logs: Path) -> None:
        for part in self.parts:
            check_after = getattr(part, "check_after", None)
            if check_after is not None:
                check_after(problems, poison, logs)


def injector_for(
    scenario: Scenario,
    pipeline: Pipeline,
    services: PrivateServices | None,
    applied: Callable[[], int],
    expected: int,
    snapshot: Callable[[], dict[str, int]],
    total: int,
    *,
    settings: Settings,
    logs: Path,
    drill: faults.Drill | None = None,
    drafts: Sequence[Draft] = (),
    poison: Sequence[str] = (),
) -> faults.Injector | Strikes:
    """The row's injector: one of its fault's kind, or :class:`Strikes` over several
    (``drill``, ``drafts``, ``poison``: for the injectors of faults.py)."""

    def one(s: Scenario) -> faults.Injector:
        made = server_faults.injector_for(
            s, pipeline, services, applied, expected, snapshot, total, settings=settings, logs=logs
        )
        return made or faults.Injector(
            s,
            pipeline,
            services,
            applied,
            expected,
            snapshot,
            total,
            drill,
            settings=settings,
            logs=logs,
            drafts=drafts,
            poison=poison,
        )

    parts = [one(s) for s in each(scenario)]
    return parts[0] if len(parts) == 1 else Strikes(parts)
