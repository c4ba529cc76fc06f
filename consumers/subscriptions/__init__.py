"""The subscriptions: processors that run on the runtime, by slug."""

from __future__ import annotations

from collections.abc import Callable

from consumers.runtime.types import Processor


def registry() -> dict[str, Callable[[], Processor]]:
    from consumers.subscriptions.ledger import Ledger

    return {"ledger": Ledger}
