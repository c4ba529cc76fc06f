"""Which dead letters a listing or a bulk action takes: the conditions, checked once (a refusal
names its field), and ``since`` read as a duration back from now or an ISO 8601 time."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from consumers.runtime.dead_letters import DeadLetter, LetterKind, LetterStatus
from streams.clock import Clock
from streams.errors import BadInput, TopologyError
from streams.topology import check_slug, unknown_queue

# A ``since`` given as a duration back from now: the command line's form (90s, 30m, 2h, 7d).
_DURATION = re.compile(r"^\s*(\d+)\s*([smhd])\s*$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86_400}


def choice(field: str, value: str | None, allowed: tuple[str, ...]) -> None:
    if value is not None and value not in allowed:
        raise BadInput(field, f"{field} {value!r} is not one of {', '.join(allowed)}")


class Selection:
    """Conditions on a dead letter, checked once (BadInput names the refused one)."""

    def __init__(
        self,
        *,
        status: LetterStatus | None,
        kind: str | None,
        subscription: str | None,
        queue: str | None,
        since: datetime | None,
    ) -> None:
        self.status = status
        self.kind = kind
        self.subscription = subscription
        self.queue = queue
        self.since = since

    @classmethod
    def of(
        cls,
        clock: Clock,
        *,
        status: str | None = None,
        kind: str | None = None,
        subscription: str | None = None,
        queue: str | None = None,
        since: str | None = None,
        queues: tuple[str, ...],
    ) -> Selection:
        """``queues``: the settings' (Topology.queues), the ones ``queue`` may name."""
        choice("status", status, tuple(LetterStatus))
        choice("kind", kind, tuple(LetterKind))
        if queue is not None and queue not in queues:
            raise BadInput("queue", str(unknown_queue(queue, queues)))
        if subscription is not None:
            try:
                check_slug(subscription)
            except TopologyError as exc:
                raise BadInput("subscription", str(exc)) from exc
        return cls(
            status=None if status is None else LetterStatus(status),
            kind=kind,
            subscription=subscription,
            queue=queue,
            since=None if since is None else since_time(since, clock.now()),
        )

    def holds(self, letter: DeadLetter) -> bool:
        return (
            (self.status is None or letter.status == self.status)
            and (self.kind is None or letter.kind == self.kind)
            and (self.subscription is None or letter.subscription == self.subscription)
            and (self.queue is None or letter.origin_queue == self.queue)
            and (self.since is None or created_at(letter) >= self.since)
        )


def since_time(text: str, now: datetime) -> datetime:
    """``2h`` (back from ``now``: s, m, h or d) or an ISO 8601 time (UTC when it names no
    offset) → the aware time it means."""
    duration = _DURATION.match(text)
    try:
        if duration is not None and int(duration.group(1)) > 0:
            return now - timedelta(seconds=int(duration.group(1)) * _UNIT_S[duration.group(2)])
        when = datetime.fromisoformat(text.strip())
        if when.tzinfo is not None:
            when.astimezone(UTC)  # an offset that takes it out of the calendar fails here
    except (ValueError, OverflowError):
        raise BadInput(
            "since",
            f"since {text[:80]!r} is neither a duration (a positive whole number and one unit, "
            "s, m, h or d: 90s, 30m, 2h, 7d) nor an ISO 8601 time (2026-01-31T09:00:00Z)",
        ) from None
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def created_at(letter: DeadLetter) -> datetime:
    return datetime.strptime(letter.created_at, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)
