"""Running calls at the same moment, as two processes (or two handler threads) would."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def all_at_once(calls: list[Callable[[], T]]) -> list[T]:
    """Run the calls in threads released together by a barrier; their results in call order.
    A call that raised re-raises here."""
    results: dict[int, T] = {}
    errors: list[BaseException] = []
    gate = threading.Barrier(len(calls))

    def run(n: int) -> None:
        gate.wait()
        try:
            results[n] = calls[n]()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(n,)) for n in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return [results[n] for n in range(len(calls))]
