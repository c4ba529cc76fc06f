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
    # The 3-broker cluster (replication factor 3, min.insync.replicas 2).
    PRIVATE_CLUSTER = "private-cluster"
    # A private broker or Redis the pipeline reaches only through a TCP proxy
    # (tests/support/tcp_proxy.py); the matrix's own checks reach it directly.
    PROXIED_KAFKA = "proxied-kafka"
    PROXIED_REDIS = "proxied-redis"


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
    dead-lettered after exactly ``max_batch_failures`` attempts, every other event applied.
    With ``stream``, the first event at or after its moment whose project is on that stream (a
    storm's joiners take the first streams' partitions: the poison's then moves between tries)."""

    stream: int | None = None


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
    # Each join leaves ``every_s`` after it first logged an assignment rather than after it
    # started: under KIP-848 the broker hands a joiner its partitions over a few heartbeats
    # (5 s apart by default, and no lower than the broker allows), not within a fixed time.
    after_assigned: bool = False


@dataclass(frozen=True, slots=True)
class Unreachable:
    """The row's ``server`` (``kafka`` or ``redis``) cut off from the pipeline for ``down_s``: the
    proxy every member reaches it through refuses new connections and drops the open ones, while
    the server itself runs on. Nothing may get through meanwhile (no row marked published, for
    the broker; no effect applied, for Redis), and everything must recover once it heals."""

    server: str
    down_s: float


@dataclass(frozen=True, slots=True)
class LeaderKill:
    """On the 3-broker cluster, the leader of the stream partition holding the most records is
    SIGKILLed (no controlled shutdown) and started again ``down_s`` later."""

    down_s: float


@dataclass(frozen=True, slots=True)
class DataLoss:
    """The private Redis stopped, its data files deleted and started empty, ``down_s`` after
    the stop: a lost disk, a node replaced by a fresh one. Cursors, claims, folds, views, the
    ledger's record and the dead-letter index all go at once."""

    down_s: float = 1.0
    # Struck only once the dead-letter index holds this many letters (and the row's moment came).
    after_letters: int = 0


@dataclass(frozen=True, slots=True)
class ClockJumps:
    """Every member's wall clock (streams/clock.py's test-only skew file) starts ``start_s``
    past a UTC midnight and is stepped by each of ``steps`` seconds in turn (by default back
    across that midnight, forward, back, forward). The first step is taken between a pass the
    publisher sent and its copies: the publisher freezes (SIGSTOP) after Kafka acknowledged its
    pass ``AtPass`` and before it marked the rows; once the ledger has applied every record on the
    streams (that pass's claims written in the new day), the clocks step back and the publisher
    is killed, so its restart sends the pass again, looked up under a clock back in the old
    day. The other steps follow ``every_s`` apart while the rest of the workload flows."""

    steps: tuple[float, ...] = (-300.0, 300.0, -300.0, 300.0)
    every_s: float = 6.0
    start_s: float = 30.0


Fault = (
    Failpoint
    | Poison
    | ServerKill
    | Freeze
    | Churn
    | Unreachable
    | LeaderKill
    | DataLoss
    | ClockJumps
)


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
    # One fault, or several at once (``strikes`` pairs each with its ``when``).
    fault: Fault | tuple[Fault, ...]
    when: When | tuple[When, ...]
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
    # Settings of this row's environment beyond the matrix's own (name, value).
    settings: tuple[tuple[str, object], ...] = ()
    # Not empty: the row cannot pass as built, and this says what happens instead and why (issue
    # 17 allows it for the Redis data loss row only). The row is "explained", not passed, when
    # what it checks finds exactly that; anything else fails it.
    explained: str = ""

    def strikes(self) -> list[tuple[Fault, When]]:
        """Each fault with its moment."""
        faults = self.fault if isinstance(self.fault, tuple) else (self.fault,)
        whens = self.when if isinstance(self.when, tuple) else (self.when,)
        assert len(faults) == len(whens), f"{self.name}: one when for each fault"
        return list(zip(faults, whens, strict=True))


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
        fault=Churn(LEDGER, times=10, every_s=2.0, after_assigned=True),
        when=AfterApplied(0.05),
        # Written over ~35 s: the storm blows while batches are in flight, not over an idle group.
        waves=12,
        wave_gap_s=3.0,
        proves=(
            "a second member joining and leaving ten times while the workload flows, under "
            "cooperative-sticky: every rebalance moves partitions mid-batch, and still each "
            "effect lands once, in order"
        ),
    ),
    Scenario(
        row=6,
        name="rebalance-storm-kip848",
        fault=Churn(LEDGER, times=10, every_s=2.0, after_assigned=True),
        when=AfterApplied(0.05),
        waves=12,
        wave_gap_s=3.0,
        settings=(("group_protocol", "consumer"),),
        proves=(
            "the same storm under KIP-848 (group.protocol=consumer: the broker assigns, "
            "incrementally): each effect lands once, in order"
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
        row=8,
        name="poison-with-rebalance-storm",
        fault=(Poison(stream=0), Churn(LEDGER, times=10, every_s=2.0, after_assigned=True)),
        when=(AtEvent(0.25), AfterApplied(0.05)),
        waves=12,
        wave_gap_s=3.0,
        # Tries ~10 s apart in all: rebalances come between them, and the poison's partition
        # moves from member to member while it is paused for its next try.
        settings=(("batch_retry_backoff_s", 1.5), ("batch_retry_backoff_max_s", 3.0)),
        proves=(
            "a poison event's tries spread over members joining and leaving ten times: it is "
            "dead-lettered once, after exactly max_batch_failures tries counted across every "
            "member that held its partition; everything else is applied once, in order"
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
        row=14,
        name="partition-leader-killed",
        fault=LeaderKill(down_s=15.0),
        when=AfterApplied(0.15),
        services=Services.PRIVATE_CLUSTER,
        waves=8,
        wave_gap_s=2.0,
        proves=(
            "on the 3-broker cluster (replication 3, min.insync.replicas 2, acks=all) the leader "
            "of the busiest stream partition SIGKILLed while the publisher sends: a survivor "
            "takes over with every acknowledged record, nothing is lost or doubled, and the "
            "killed broker rejoins"
        ),
    ),
    Scenario(
        row=15,
        name="broker-unreachable",
        fault=Unreachable("kafka", down_s=30.0),
        when=AfterApplied(0.15),
        services=Services.PROXIED_KAFKA,
        waves=8,
        wave_gap_s=2.0,
        # Sends time out within the outage (30 s by default, as long as it): the publisher's
        # rows are deferred and backed off, never counted as attempts.
        settings=(("outbox_delivery_timeout_s", 10.0),),
        proves=(
            "the broker cut off from every member for 30 s (through the proxy, no way round it) "
            "while the publisher sends: no record reaches it meanwhile, the publisher's sends "
            "time out and its rows wait in retry_wait, none ends up failed; once it heals "
            "everything is sent, applied once and in order"
        ),
    ),
    Scenario(
        row=17,
        name="redis-data-lost",
        fault=(Poison(), DataLoss(after_letters=1)),
        when=(AtEvent(0.05), AfterApplied(0.3)),
        services=Services.PRIVATE_REDIS,
        # Written over ~15 s: the poison's letter is written early and Redis is lost while the
        # subscriptions are still behind.
        waves=8,
        wave_gap_s=2.0,
        proves=(
            "Redis restarted with its data lost under load: every subscription of Redis effects "
            "rebuilds its state from the streams, each event applied once, and an event "
            "dead-lettered before the loss stays dead-lettered once"
        ),
        explained=(
            "Redis came back empty: no partition had a cursor, so each subscription of Redis "
            "effects read every partition from its log start into the empty Redis and rebuilt "
            "the views and the ledger exactly (I1, I2, I4 and I5 hold against the rebuilt "
            "record, which cannot show the applications lost with Redis); but the dead-letter "
            "index and the failure counts were lost too, so the poison event dead-lettered "
            "before the loss was tried max_batch_failures times more and dead-lettered again "
            "(two letters for it on the dead-letter topic, I3). The rebuild is exact only while "
            "the streams hold every event. docs/reliability.md proposes the mechanism that "
            "would make the row pass"
        ),
    ),
    Scenario(
        row=18,
        name="redis-unreachable",
        fault=Unreachable("redis", down_s=15.0),
        when=AfterApplied(0.3),
        services=Services.PROXIED_REDIS,
        fast=True,
        proves=(
            "Redis cut off from every member for 15 s (through the proxy): no effect is applied "
            "meanwhile (an effect never lands without its claim and cursor), and once it heals "
            "every event is applied once, in order"
        ),
    ),
    Scenario(
        row=19,
        name="clock-jumps",
        fault=ClockJumps(),
        when=AtPass(3),
        waves=8,
        wave_gap_s=3.0,
        proves=(
            "every member's wall clock starting just past a UTC midnight and stepped back and "
            "forth across it by 5 minutes, the first step back between a pass the publisher "
            "sent and its re-send: the copies are still recognised (their claims are in the "
            "day ahead), nothing is lost or doubled"
        ),
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
