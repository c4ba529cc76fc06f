"""The publisher's policy and the row state machine, as pure functions of (row, outcome, now).

Two counters per row, so an outage can grow the backoff without using up the row's attempts:

- ``attempts``: sends that failed because of the row itself (:attr:`Fault.ROW`: too large,
  rejected by the broker). At ``max_row_attempts`` the row is ``failed``.
- ``deferrals``: sends that failed for reasons that are not the row's (:attr:`Fault.OUTAGE`:
  broker unreachable, delivery timed out; :attr:`Fault.FATAL`: the producer had to be rebuilt).
  They never fail a row, so an hour-long outage fails nothing.

The wait before the next try is ``backoff_initial_s * 2 ** (attempts + deferrals - 1)``, capped
at ``backoff_max_s``: 1 s, 2 s, 4 s … 5 min with the defaults.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from streams.errors import ConfigurationError
from streams.outbox.store import OutboxRow, RowState, RowUpdate

# 2**60 seconds is far past any cap; bounding the exponent keeps the float finite.
_MAX_EXPONENT = 60


class Ordering(StrEnum):
    """How the publisher keeps each project's order on Kafka (see docs/outbox.md)."""

    SERIAL = "serial"  # one row in flight per project
    PIPELINED = "pipelined"  # a project's whole window in flight, under the gapless guarantee


@dataclass(frozen=True, slots=True)
class PublisherPolicy:
    """Every number the publisher uses; built from settings in router/."""

    rows_per_project: int
    rows_per_pass: int
    max_row_attempts: int
    backoff_initial_s: float
    backoff_max_s: float
    poll_interval_s: float
    delivery_timeout_s: float
    ordering: Ordering

    def __post_init__(self) -> None:
        positive = {
            "outbox_rows_per_project_per_pass": self.rows_per_project,
            "outbox_rows_per_pass": self.rows_per_pass,
            "outbox_max_row_attempts": self.max_row_attempts,
            "outbox_backoff_initial_s": self.backoff_initial_s,
            "outbox_backoff_max_s": self.backoff_max_s,
            "outbox_poll_interval_s": self.poll_interval_s,
            "outbox_delivery_timeout_s": self.delivery_timeout_s,
        }
        for name, value in positive.items():
            if value <= 0:
                raise ConfigurationError(f"{name} must be greater than 0, got {value}")
        if self.backoff_max_s < self.backoff_initial_s:
            raise ConfigurationError(
                f"outbox_backoff_max_s ({self.backoff_max_s}) is below outbox_backoff_initial_s "
                f"({self.backoff_initial_s}); raise the cap or lower the first wait"
            )


@dataclass(frozen=True, slots=True)
class Published:
    pass


@dataclass(frozen=True, slots=True)
class RowFault:
    """The row itself was refused (Fault.ROW)."""

    error: str


@dataclass(frozen=True, slots=True)
class Deferred:
    """The send failed through no fault of the row (outage, producer rebuilt)."""

    error: str


@dataclass(frozen=True, slots=True)
class NoStream:
    """No producer exists for the row's stream (the topic is not on the broker)."""

    stream: str


Outcome = Published | RowFault | Deferred | NoStream


def backoff_s(failures: int, policy: PublisherPolicy) -> float:
    """The wait after the ``failures``-th consecutive failed send (1-based)."""
    exponent = min(max(failures, 1) - 1, _MAX_EXPONENT)
    return float(min(policy.backoff_initial_s * 2**exponent, policy.backoff_max_s))


def transition(row: OutboxRow, outcome: Outcome, policy: PublisherPolicy, now: float) -> RowUpdate:
    """The row's next state after one send."""
    if isinstance(outcome, Published):
        return RowUpdate(
            row.event_id,
            RowState.PUBLISHED,
            row.attempts,
            row.deferrals,
            None,
            row.last_error,
            now,
        )
    if isinstance(outcome, NoStream):
        return RowUpdate(
            row.event_id,
            RowState.FAILED,
            row.attempts,
            row.deferrals,
            None,
            f"no producer for stream '{outcome.stream}': the topic does not exist on the broker; "
            "provision the environment (rhumbatron provision), then retry the row "
            f"(rhumbatron outbox retry {row.event_id})",
            None,
        )
    if isinstance(outcome, RowFault):
        attempts = row.attempts + 1
        if attempts >= policy.max_row_attempts:
            return RowUpdate(
                row.event_id,
                RowState.FAILED,
                attempts,
                row.deferrals,
                None,
                f"{outcome.error} (row-level failure {attempts} of {policy.max_row_attempts})",
                None,
            )
        wait = backoff_s(attempts + row.deferrals, policy)
        return RowUpdate(
            row.event_id,
            RowState.RETRY_WAIT,
            attempts,
            row.deferrals,
            now + wait,
            outcome.error,
            None,
        )
    deferrals = row.deferrals + 1
    wait = backoff_s(row.attempts + deferrals, policy)
    return RowUpdate(
        row.event_id,
        RowState.RETRY_WAIT,
        row.attempts,
        deferrals,
        now + wait,
        outcome.error,
        None,
    )
