"""What a benchmark case measures: rows. A case runs in a child process of its own, once per round,
and returns the rows it measured; the harness keeps every round's value of a row, reports its
median and spread, and divides the median by the median of the row named in ``vs`` (measured in the
same run) for the ratio."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Row:
    name: str  # a row of the table, e.g. "projector", "e2e-p99-ms"
    value: float
    unit: str  # "events/s", "rows/s", "commands/s", "ms", "B", "MB", "x"
    vs: str | None = None  # the row this one is set beside (its ratio is value / that value)
    note: str = ""  # what was measured: sizes, batches, what limits it


def rate(
    name: str, items: int, seconds: float, unit: str, *, vs: str | None = None, note: str = ""
) -> Row:
    """A throughput row: ``items`` in ``seconds``."""
    if seconds <= 0:
        raise ValueError(f"{name}: {items} {unit} in {seconds} s is no rate")
    return Row(name, items / seconds, unit, vs=vs, note=note)
