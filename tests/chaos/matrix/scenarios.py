"""The matrix's rows. A row is a ``Scenario``: the fault, when it strikes, the workload and which
servers it runs on (a row that kills a server gets private ones, so the shared servers other
tests use are never disturbed). Adding a row is adding an entry to ``SCENARIOS``.

``row`` is the row's number in issue 17's list of 22.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

# The pipeline's processes a fault can target; subscriptions by their slug.
PUBLISHER = "publisher"
LEDGER = "ledger"
PROJECTOR = "project-view-projector"
SUBSCRIPTIONS = (LEDGER, PROJECTOR)


class Services(StrEnum):
    """Where a row runs: on the shared servers, or with a private broker or Redis it may kill."""

    SHARED = "shared"
    PRIVATE_KAFKA = "private-kafka"
    PRIVATE_REDIS = "private-redis"


# -- faults -----------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Failpoint:
    """The process ``role`` SIGKILLs itself at a fail-point (streams/failpoints.py); the
    supervisor restarts it, as the fleet would, without the fail-point armed."""

    role: str
    point: str


@dataclass(frozen=True, slots=True)
class Poison:
    """One event of the workload the ledger fails on every time (its drill payload): it must be
    dead-lettered after exactly ``max_batch_failures`` attempts, every other event applied."""


@dataclass(frozen=True, slots=True)
class ServerKill:
    """The row's private ``server`` (``kafka`` or ``redis``) SIGKILLed, restarted ``down_s``
    later, while the pipeline runs."""

    server: str
    down_s: float


@dataclass(frozen=True, slots=True)
class Freeze:
    """The process ``role`` SIGSTOPs itself at a fail-point (a long GC pause, a frozen VM); a
    second member of its group is started and takes its partitions once its session expires;
    ``frozen_s`` after it froze it is resumed (SIGCONT), and the write it was about to make must
    be refused (its owner epoch is stale): a zombie's late effect never lands."""

    role: str
    point: str
    frozen_s: float


@dataclass(frozen=True, slots=True)
class Churn:
    """A second member of ``role``'s group joins and leaves ``times`` times, ``every_s`` apart
    (a deploy rolling over and over, an autoscaler flapping): every join and leave a rebalance
    that moves partitions while batches are in flight."""

    role: str
    times: int
    every_s: float


@dataclass(frozen=True, slots=True)
class Garbage:
    """Records no producer of ours writes (tests/support/hostile.py: garbage, no value, JSON of
    other shapes, an event cut short or nested too deep or over the size limit, headers with no
    value, not UTF-8, repeated, ours lying, huge, a record near the broker's limit), put straight
    onto ``partitions`` stream partitions by a raw producer while the pipeline runs. Each
    subscription must dead-letter each of them as poison, once."""

    partitions: int


@dataclass(frozen=True, slots=True)
class OperatorMoves:
    """An operator's moves through the command line while each owner runs (moves.py): skip
    through the ledger's drill event (the workload's event at ``poison_at``, failing for ever:
    the row runs the ledger under the ``block`` failure policy), reprocess another ledger
    partition from half-way back, re-reduce a project-view-projector partition."""

    poison_at: float


Fault = Failpoint | Poison | ServerKill | Freeze | Churn | Garbage | OperatorMoves


# -- when a fault strikes -----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class AtPass:
    """A fail-point fires on its ``nth`` pass (the publisher's nth pass with rows, a consumer's
    nth batch)."""

    nth: int


@dataclass(frozen=True, slots=True)
class AfterApplied:
    """Once the ledger has applied this fraction of the workload."""

    fraction: float


@dataclass(frozen=True, slots=True)
class AtEvent:
    """The workload's event at this fraction of its length (in write order)."""

    fraction: float


When = AtPass | AfterApplied | AtEvent


@dataclass(frozen=True, slots=True)
class Scenario:
    row: int
    name: str
    fault: Fault
    when: When
    proves: str  # one sentence: what a pass of this row shows
    projects: int = 40
    events: int = 2000
    services: Services = Services.SHARED
    fast: bool = False  # in `make test`'s subset
    # The workload is written in waves, this far apart, so faults strike a pipeline under load
    # (the publisher still sending, the subscriptions behind) rather than an idle one.
    waves: int = 4
    wave_gap_s: float = 1.5
    # I5's bound: from the last wave written to lag 0 with the fault healed.
    drain_bound_s: float = 180.0


SCENARIOS: tuple[Scenario, ...] = (
    Scenario(
        row=1,
        name="publisher-killed-after-ack",
        fault=Failpoint(PUBLISHER, "publisher.after_ack"),
        when=AtPass(3),
        proves=(
            "a publisher SIGKILLed after Kafka acknowledged a pass but before it marked the rows "
            "published re-sends that pass on restart; the subscriptions absorb the copies: each "
            "event applied once, in project order, views equal the oracle's"
        ),
    ),
    Scenario(
        row=4,
        name="consumer-killed-after-effect",
        fault=Failpoint(LEDGER, "runtime.after_store_commit"),
        when=AtPass(3),
        proves=(
            "a consumer SIGKILLed after its effects and claims committed to Redis but before its "
            "Kafka offsets did resumes from the cursor stored with its state: the batch it "
            "re-reads is recognised as applied, no effect doubled, none lost"
        ),
        fast=True,
    ),
    Scenario(
        row=5,
        name="consumer-frozen-past-its-session",
        fault=Freeze(LEDGER, "runtime.before_store_commit", frozen_s=20.0),
        when=AtPass(3),
        proves=(
            "a consumer frozen (SIGSTOP) in the middle of a batch, past its session timeout, "
            "loses its partitions to another member; resumed, the write it was about to make is "
            "refused by the owner epoch: no effect lands twice, none is lost"
        ),
    ),
    Scenario(
        row=6,
        name="rebalance-storm",
        fault=Churn(LEDGER, times=5, every_s=6.0),
        when=AfterApplied(0.05),
        proves=(
            "a second member joining and leaving five times while the workload flows: every "
            "rebalance moves partitions mid-batch, and still each effect lands once, in order"
        ),
    ),
    Scenario(
        row=7,
        name="poison-event-with-others-behind",
        fault=Poison(),
        when=AtEvent(0.25),
        proves=(
            "one event that fails every time is dead-lettered after exactly max_batch_failures "
            "attempts and is the only one: other projects' events behind it in its partition, "
            "and its own project's later events, are applied in order"
        ),
    ),
    Scenario(
        row=9,
        name="garbage-on-a-stream",
        fault=Garbage(partitions=3),
        when=AfterApplied(0.2),
        proves=(
            "records no producer of ours writes, put straight onto three stream partitions "
            "while the pipeline runs (garbage, no value, JSON of other shapes, an event cut "
            "short, nested too deep or over the limit, headers with no value, not UTF-8, "
            "repeated, ours lying, huge, a record near the broker's limit): each subscription "
            "dead-letters each as poison once, holding its bytes and headers as they came, and "
            "applies every real event once, in order"
        ),
    ),
    Scenario(
        row=13,
        name="broker-killed-under-load",
        fault=ServerKill("kafka", down_s=8.0),
        when=AfterApplied(0.15),
        services=Services.PRIVATE_KAFKA,
        # Written over ~15 s: the publisher still has waves to send when the broker dies.
        waves=8,
        wave_gap_s=2.0,
        proves=(
            "the single broker SIGKILLed and restarted while the publisher sends and the "
            "subscriptions consume: publisher retries and consumer reconnects lose nothing and "
            "double nothing; lag returns to 0"
        ),
    ),
    Scenario(
        row=16,
        name="redis-killed-under-load",
        fault=ServerKill("redis", down_s=3.0),
        when=AfterApplied(0.3),
        services=Services.PRIVATE_REDIS,
        proves=(
            "Redis (append-only, fsync every second) SIGKILLed and restarted under load: what "
            "its last second lost, it lost with the cursors and claims in the same script, so "
            "the subscriptions re-apply exactly that; nothing lost, nothing doubled"
        ),
        fast=True,
    ),
    Scenario(
        row=22,
        name="operator-moves-under-load",
        fault=OperatorMoves(poison_at=0.25),
        when=AfterApplied(0.3),
        # Written over ~15 s: the moves land while the publisher still sends.
        waves=8,
        wave_gap_s=2.0,
        proves=(
            "skip-through, reprocess-from and re-reduce run from the command line while the "
            "owners apply: the skipped drill event is accounted for by the audit, not lost and "
            "not dead-lettered; each re-run event is applied once more, at the new revision, in "
            "order; the rebuilt fold changes no view; nothing else is doubled or lost"
        ),
        fast=True,
    ),
)


def by_name(names: list[str]) -> list[Scenario]:
    known = {s.name: s for s in SCENARIOS}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SystemExit(
            f"chaos: no row named {', '.join(unknown)}; the rows are: {', '.join(known)}"
        )
    return [known[n] for n in names]
