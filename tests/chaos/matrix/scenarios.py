"""The matrix's rows. A row is a ``Scenario``: the fault, when it strikes, the workload and which
servers it runs on (a row that kills a server gets private ones, so the shared servers other
tests use are never disturbed). Adding a row is adding an entry to ``SCENARIOS``.

``row`` is the row's number in issue 17's list of 22.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from tests.chaos.matrix.command_worker import Failures

# The pipeline's processes a fault can target; subscriptions by their slug.
PUBLISHER = "publisher"
LEDGER = "ledger"
PROJECTOR = "project-view-projector"
SUBSCRIPTIONS = (LEDGER, PROJECTOR)
# The command side (rows with ``commands``): the causal router (Kafka effects: its commands and
# consumed offsets in one transaction) and one worker per queue it writes to.
ROUTER = "causal-router"
COMMAND_QUEUES = ("agent-wakeups", "integration", "indexing")


def worker_role(queue: str) -> str:
    return f"worker-{queue}"


WORKERS = tuple(worker_role(q) for q in COMMAND_QUEUES)


class Services(StrEnum):
    """Where a row runs: on the shared servers, or with a private broker or Redis it may kill."""

    SHARED = "shared"
    PRIVATE_KAFKA = "private-kafka"
    PRIVATE_REDIS = "private-redis"
    PRIVATE_POSTGRES = "private-postgres"
    # The 3-broker cluster (replication factor 3, min.insync.replicas 2).
    PRIVATE_CLUSTER = "private-cluster"
    # A private broker or Redis the pipeline reaches only through a TCP proxy
    # (tests/support/tcp_proxy.py); the matrix's own checks reach it directly.
    PROXIED_KAFKA = "proxied-kafka"
    PROXIED_REDIS = "proxied-redis"


class Outbox(StrEnum):
    """Where the row's writers commit their events and its publisher reads them: a SQLite file, or
    a PostgreSQL schema of the row's own (on the shared server, or on the row's private one)."""

    SQLITE = "sqlite"
    POSTGRES = "postgres"


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
    """The row's private ``server`` (``kafka``, ``redis`` or ``postgres``) SIGKILLed, restarted
    ``down_s`` later, while the pipeline runs."""

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
class RouterPoison:
    """One event (the workload's first ``intent.declared`` from ``AtEvent`` on) that both the
    ledger (Redis effects: its drill payload) and the causal router (Kafka effects: its
    ``resources`` is empty, which the catalog allows and the router's fold refuses) fail on
    every try: each dead-letters it after exactly ``max_batch_failures`` attempts; the router
    decides every other command as if the event had never come (a dead-lettered event is not
    folded)."""


@dataclass(frozen=True, slots=True)
class DeadLetterOutage:
    """The ledger's poison event (as ``Poison``) meets a dead-letter store that cannot write:
    the dead-letter topic refuses every record (its ``max.message.bytes`` shrunk below any
    letter) from the start until the ledger has logged ``failed_writes`` failed dead-letter
    writes; then it is restored. Nothing may be committed past the event meanwhile, and the
    letter must then be written once, after exactly ``max_batch_failures`` attempts."""

    failed_writes: int = 3


@dataclass(frozen=True, slots=True)
class FailingCommands:
    """No fault from outside: the row's command workers fail commands by its ``Failures``
    rule, so retries with their delay and dead-lettering run under load."""


@dataclass(frozen=True, slots=True)
class TransactionalZombie:
    """The transactional producer of ``role`` SIGSTOPs itself at a fail-point before or inside
    a transaction; ``takeover_after_s`` later a replacement starts (it gets the partitions once
    the frozen member's session expires; a transaction left open is aborted by the broker at
    its timeout, which bumps the frozen producer's epoch); ``frozen_s`` after the freeze the old
    one is resumed (SIGCONT). Its late transaction must be refused (fenced: a stale producer
    epoch or group generation) and nothing it wrote may reach a read-committed reader."""

    role: str
    point: str
    takeover_after_s: float
    frozen_s: float


@dataclass(frozen=True, slots=True)
class LongOutage:
    """The row's private broker stopped for ``down_s``, longer than the publisher's whole backoff
    ladder several times over (outbox_backoff_initial_s doubling up to outbox_backoff_max_s; the
    row shortens it in its settings), then started: the rows wait in retry_wait for as long as
    it lasts, deferred many more times than outbox_max_row_attempts, and none becomes failed."""

    down_s: float


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
class RefusedProject:
    """One project's events, from the workload's event ``when`` names on, are larger than its
    stream's ``max.message.bytes`` (lowered to ``limit_bytes``), and the broker refuses each
    send of them (a row-level error): the project's head row fails after
    outbox_max_row_attempts and holds the project back while every other project flows.
    ``held_s`` after the hold shows, the operator raises the limit and runs ``rhumbatron outbox
    retry`` on the failed row."""

    limit_bytes: int
    record_bytes: int
    held_s: float


@dataclass(frozen=True, slots=True)
class SecondPublisher:
    """A second publisher started on the same outbox while the first runs (supervised: restarted
    if it exits): it finds the outbox's publisher lease held and stands by, without exiting,
    until, ``standby_s`` later, the first is stopped (SIGTERM: it finishes its pass and lets go)
    and the second takes over."""

    standby_s: float


@dataclass(frozen=True, slots=True)
class OutboxServerKill:
    """The outbox's private PostgreSQL SIGKILLed in the middle of a publish: the publisher pauses
    (SIGSTOP, fail-point ``publisher.after_ack``) holding Kafka's acknowledgement of a pass it
    has not yet marked; the server is killed and the publisher resumed into its loss, while
    writers hold transactions open; the server is started again ``down_s`` later."""

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
class Restore:
    """A snapshot (RDB) of the private Redis taken when the row's moment comes; at least
    ``after_s`` later, once the dead-letter index holds ``after_letters`` letters more than the
    snapshot does, Redis is restored from it (``infra/local.sh redis-restore``, the runbook's
    restore): cursors, claims, folds, views, the ledger's record, the workers' marks and the
    dead-letter index all go back together to the snapshot, under load."""

    after_s: float = 6.0
    after_letters: int = 1


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


@dataclass(frozen=True, slots=True)
class RollingUpgrade:
    """The previous release (upgrade.py: CHANGELOG.md's entry before this one, in a git worktree
    of its commit and a venv of its own) and this one in each subscription's group under load;
    then the previous stopped (``mixed_s`` after the start); then a rollback to it, this one
    stopped; ``rollback_s`` later forward again and ``rhumbatron state migrate --finalize``, after
    which the previous release, started once more, must refuse to write when its layout is
    older."""

    rollback_s: float


Fault = (
    Failpoint
    | Poison
    | ServerKill
    | Freeze
    | Churn
    | RouterPoison
    | DeadLetterOutage
    | FailingCommands
    | TransactionalZombie
    | LongOutage
    | RefusedProject
    | SecondPublisher
    | OutboxServerKill
    | Unreachable
    | LeaderKill
    | DataLoss
    | Restore
    | ClockJumps
    | Garbage
    | OperatorMoves
    | RollingUpgrade
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
class CommandSide:
    """The command side in the pipeline: the causal router and a worker per queue it writes
    to (tests/chaos/matrix/command_worker.py, whose handler keeps the journal), each queue with
    ``retries`` and ``retry_delay_s``, its handlers failing commands by ``failures``."""

    failures: Failures = field(default_factory=Failures)
    retries: int = 3
    retry_delay_s: float = 1.0


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
    # The command side (router and workers) in the pipeline, checked too; None: events only.
    commands: CommandSide | None = None
    outbox: Outbox = Outbox.SQLITE
    # How long each writer's transaction stays open before it commits (the service's own work in
    # it): writers that hold their transactions are in the middle of one whenever a fault strikes.
    write_hold_s: float = 0.0
    # Settings of the row's environment beyond the matrix's own (a shortened backoff ladder, a
    # queue's partitions).
    settings: Mapping[str, object] = field(default_factory=dict)

    def strikes(self) -> list[tuple[Fault, When]]:
        """Each fault with its moment."""
        faults = self.fault if isinstance(self.fault, tuple) else (self.fault,)
        whens = self.when if isinstance(self.when, tuple) else (self.when,)
        assert len(faults) == len(whens), f"{self.name}: one when for each fault"
        return list(zip(faults, whens, strict=True))


_ROWS = (
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
        row=1,
        name="broker-down-past-backoff-ladder",
        fault=LongOutage(down_s=30.0),
        when=AfterApplied(0.1),
        services=Services.PRIVATE_KAFKA,
        waves=8,
        wave_gap_s=2.0,
        # A ladder of 0.25, 0.5, 1 and 2 s (3.75 s to climb), 3 row-level attempts: the outage
        # lasts the ladder eight times over and defers the rows it strikes more often than their
        # attempts would allow, were an outage counted against them.
        settings={
            "outbox_backoff_initial_s": 0.25,
            "outbox_backoff_max_s": 2.0,
            "outbox_max_row_attempts": 3,
            "outbox_delivery_timeout_s": 2.0,
        },
        proves=(
            "the broker stopped for longer than the publisher's whole backoff ladder, many times "
            "over, while rows are written and sent: they wait in retry_wait at the capped backoff "
            "for as long as it lasts, none is charged an attempt or ends up failed, and once the "
            "broker is back everything is published and applied once, in order"
        ),
    ),
    Scenario(
        row=2,
        name="one-project-refused-others-flow",
        fault=RefusedProject(limit_bytes=16 * 1024, record_bytes=48 * 1024, held_s=5.0),
        when=AtEvent(0.3),
        # Written over ~15 s: other projects are still being written while this one is held.
        waves=8,
        wave_gap_s=2.0,
        settings={
            "outbox_max_row_attempts": 3,
            "outbox_backoff_initial_s": 0.2,
            "outbox_backoff_max_s": 1.0,
        },
        proves=(
            "one project whose sends the broker refuses (records over its stream's size limit) "
            "fails its head row after outbox_max_row_attempts and is held, its later rows unsent, "
            "while every other project, its stream's included, keeps flowing; once the operator "
            "raises the limit and runs `outbox retry`, the project resumes where it stopped and "
            "reaches the streams and the subscriptions in slot order"
        ),
        fast=True,
    ),
    Scenario(
        row=3,
        name="second-publisher-on-sqlite",
        fault=SecondPublisher(standby_s=6.0),
        when=AfterApplied(0.05),
        waves=8,
        wave_gap_s=2.0,
        proves=(
            "a second publisher started on a SQLite outbox that has one stands by (the lock "
            "file), never exiting; when the first is stopped it takes over: no row is sent "
            "twice (nothing crashed, so the streams hold no copy), order is kept per project"
        ),
    ),
    Scenario(
        row=3,
        name="second-publisher-on-postgres",
        fault=SecondPublisher(standby_s=6.0),
        when=AfterApplied(0.05),
        outbox=Outbox.POSTGRES,
        waves=8,
        wave_gap_s=2.0,
        proves=(
            "the same on a PostgreSQL outbox (the advisory lock): standing by while the first "
            "holds the lock, taking over once it is stopped, no row sent twice, order kept per "
            "project"
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
        settings={"group_protocol": "consumer"},
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
        settings={"batch_retry_backoff_s": 1.5, "batch_retry_backoff_max_s": 3.0},
        proves=(
            "a poison event's tries spread over members joining and leaving ten times: it is "
            "dead-lettered once, after exactly max_batch_failures tries counted across every "
            "member that held its partition; everything else is applied once, in order"
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
        row=7,
        name="poison-event-for-the-router",
        fault=RouterPoison(),
        when=AtEvent(0.25),
        commands=CommandSide(),
        proves=(
            "one event that the ledger (Redis effects) and the causal router (Kafka effects) "
            "both fail on every time is dead-lettered by each after exactly max_batch_failures "
            "attempts; the events behind it are applied in order, and the commands on the "
            "queues are exactly those the rules decide without it, each once, each run once"
        ),
    ),
    Scenario(
        row=10,
        name="dead-letter-write-failing",
        fault=DeadLetterOutage(failed_writes=3),
        when=AtEvent(0.25),
        proves=(
            "a poison event due for its dead letter while the dead-letter store cannot write "
            "holds its partition: nothing is committed past it and nothing is lost; once the "
            "store writes again the letter is written once, after exactly max_batch_failures "
            "attempts"
        ),
    ),
    Scenario(
        row=11,
        name="command-retries-with-delay",
        fault=FailingCommands(),
        when=AtEvent(0.0),
        commands=CommandSide(
            failures=Failures(once=0.1, twice=0.05, always=0.05), retries=3, retry_delay_s=2.0
        ),
        proves=(
            "commands failing once, twice or always under load run exactly 1, 2, 3 or "
            "1 + retries times, each attempt at least the queue's retry delay after the failure "
            "before it; those failing always are on the dead-letter queue once each after "
            "exactly 1 + retries attempts; every other command's handler completes once"
        ),
    ),
    Scenario(
        row=12,
        name="worker-revoked-during-retry-delay",
        # Each member holds its partitions longer than the delay: it runs the retries due
        # meanwhile, and those fetched but not yet due when it leaves wait through the move.
        fault=Churn(worker_role("integration"), times=4, every_s=10.0),
        when=AfterApplied(0.05),
        commands=CommandSide(failures=Failures(once=0.2, twice=0.1), retry_delay_s=3.0),
        settings={"queue_partitions": 2},
        proves=(
            "a second integration worker joining and leaving while retries wait out their "
            "delay: each retry runs once, never before its due time, none lost to a revoke, "
            "none doubled by the partition's next owner"
        ),
    ),
    Scenario(
        row=20,
        name="transactional-zombie-router",
        # Frozen once a batch's fold, claims, cursor and pending commands are in Redis, before
        # its transaction: resumed, the zombie sends those commands in a late transaction.
        fault=TransactionalZombie(
            ROUTER, "runtime.after_store_commit", takeover_after_s=0.0, frozen_s=25.0
        ),
        when=AtPass(5),
        commands=CommandSide(),
        proves=(
            "a causal router frozen after a batch's Redis commit, before its transaction, loses "
            "its partitions to a replacement, which sends the batch's commands from their "
            "pending copy; resumed, the zombie sends them again in a late transaction, which is "
            "refused (fenced): nothing it wrote reaches a read-committed reader, and each "
            "command is on its queue once"
        ),
    ),
    Scenario(
        row=20,
        name="transactional-zombie-worker",
        fault=TransactionalZombie(
            worker_role("integration"),
            "worker.before_transaction_commit",
            takeover_after_s=0.0,
            frozen_s=25.0,
        ),
        when=AtPass(3),
        commands=CommandSide(failures=Failures(once=0.2, always=0.05), retry_delay_s=1.0),
        proves=(
            "an integration worker frozen with its transaction open (retries, dead letters and "
            "offsets sent, not committed) is replaced; the broker aborts the transaction at its "
            "timeout and the replacement handles those commands again at the same attempts; "
            "resumed, the zombie's commit is refused (fenced): each retry and dead letter once, "
            "each command's effect once"
        ),
    ),
    Scenario(
        row=21,
        name="postgres-killed-mid-publish",
        # Down longer than connect_timeout_s (10 s): the pools' wait for a connection runs out,
        # so writers and the publisher see the outage as an error, not only a slow commit.
        fault=OutboxServerKill(down_s=12.0),
        when=AtPass(3),
        services=Services.PRIVATE_POSTGRES,
        outbox=Outbox.POSTGRES,
        # One wave written steadily over ~13 s, four transactions open at almost every moment.
        waves=1,
        write_hold_s=0.12,
        proves=(
            "the outbox's PostgreSQL SIGKILLed and restarted while writers hold transactions "
            "open and the publisher holds Kafka's acknowledgement of a pass it has not marked: a "
            "writer whose transaction failed writes it again, the publisher exits naming the "
            "server and its restart sends that pass again; every project's slots stay dense (no "
            "gap, none used twice), no committed row is lost, nothing is applied twice"
        ),
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
        settings={"outbox_delivery_timeout_s": 10.0},
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
            "Redis restarted with its data lost under load: the dead-letter index comes back "
            "from the audit topic, and each partition, finding no cursor, first claims the "
            "events its letters hold; every subscription of Redis effects then rebuilds its "
            "state from the streams, each event applied once, and the event dead-lettered "
            "before the loss is neither tried nor dead-lettered again"
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
    Scenario(
        row=23,
        name="rolling-upgrade",
        fault=RollingUpgrade(rollback_s=6.0),
        when=AfterApplied(0.25),
        # Written over ~20 s: each step of the upgrade lands while the publisher still sends.
        waves=10,
        wave_gap_s=2.0,
        proves=(
            "the previous release and this one share each subscription's group under load, "
            "then the previous one leaves, comes back (a rollback) and leaves again, and the "
            "state is finalized to this release's layout: no event lost or doubled, per-project "
            "order kept, views equal the oracle's; once finalized the previous release, if it "
            "speaks an older layout, writes nothing and exits 78"
        ),
    ),
    Scenario(
        row=24,
        name="redis-restored-from-snapshot",
        fault=(Poison(), Restore()),
        when=(AtEvent(0.5), AfterApplied(0.2)),
        services=Services.PRIVATE_REDIS,
        commands=CommandSide(),
        # Written over ~15 s: the snapshot is taken early, the poison is dead-lettered after
        # it, and Redis goes back while the subscriptions are still behind.
        waves=8,
        wave_gap_s=2.0,
        proves=(
            "Redis restored under load from a snapshot taken seconds earlier: each partition "
            "finds its cursor behind its group's committed offset; the subscriptions of Redis "
            "effects re-apply from the snapshot's cursors into the snapshot's state, the causal "
            "router refolds through its committed transaction without sending anything again, "
            "and the poison dead-lettered after the snapshot is neither tried nor dead-lettered "
            "again: views, ledger and commands as if nothing had happened"
        ),
    ),
)

# In the order of issue 17's list (a stable sort: a row's variants as written).
SCENARIOS: tuple[Scenario, ...] = tuple(sorted(_ROWS, key=lambda scenario: scenario.row))


def by_name(names: list[str]) -> list[Scenario]:
    known = {s.name: s for s in SCENARIOS}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SystemExit(
            f"chaos: no row named {', '.join(unknown)}; the rows are: {', '.join(known)}"
        )
    return [known[n] for n in names]
