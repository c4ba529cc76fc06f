"""Every exception Rhumbatron defines, in one flat module: import them from here, never from the
module that raises them.

Two roots, neither under the other. ``RhumbatronError`` is for errors: something was wrong, and the
message says what, with what value, and what to do; the CLI prints one as a single line.
``InternalSignal`` is for control flow: raised and caught inside our own code to steer it (deliver
again, read again later, ask again); none reaches a user, and an ``except RhumbatronError`` never
swallows one.

    RhumbatronError                 root of errors: catch this to catch every error of ours
    ├── EnvelopeError               (ValueError) an Event or Command failed validation
    │   └── EnvelopeTooLarge        the encoded envelope exceeds the size limit
    ├── TopologyError               (ValueError) a bad stream/queue name or a plan the rules refuse
    │   └── NotProvisioned          topics a command needs do not exist: run `rhumbatron provision`
    ├── ConfigurationError          (ValueError) a setting's bad value, or settings that clash
    ├── Unreachable                 (ConnectionError) Kafka, Redis or a file did not answer
    ├── ServerRefused               Kafka or Redis answered, but refused the request
    ├── KafkaLoginRefused           Kafka refused the SASL login, or the TLS handshake failed
    ├── DeliveryFailed              Kafka refused or timed out records; one FailedRecord each
    ├── TransactionFailed           a Kafka transaction could not commit (aborted or fenced)
    ├── OutboxError                 the outbox refused an operation (names the row or project)
    │   ├── SlotConflict            a strict append was refused: the project moved past the slot
    │   ├── PublisherLocked         another publisher holds the outbox (names its pid)
    │   │   └── PublisherLeaseHeld  another publisher holds a PostgreSQL outbox's advisory lock
    │   └── OutboxSchemaError       a PostgreSQL database without the outbox schema, or another version
    ├── StoredRowInvalid            (ValueError) an outbox row written with bad columns: unsendable
    ├── Fenced                      a progress write by a stale owner: the partition moved on
    ├── InstanceIdHeld              KIP-848 still holds this static member id for a killed process
    ├── LayoutNewer                 the state is in a layout newer than this release speaks: it stops
    ├── ReplicasBehind              a Redis commit not on the replicas WAIT asked for: the process stops
    ├── CursorMoved                 a compare-and-set found the cursor moved since it was read
    ├── PendingEffects              new Kafka effects refused while earlier ones are unpublished
    ├── ProducerLeaseLost           this process's transactional-id lease expired under it
    ├── TransactionsOpen            a topic's end stayed behind an open transaction too long
    ├── ControlRefused              an operator control (reset, reprocess …) was refused
    │   └── ArchiveIncomplete       the archive cannot supply every offset a control needs
    ├── DeadLetterActionRefused     a retry or dismiss of a dead letter was refused
    ├── AuditNotDurable             the audit topic did not take an entry: the action was not done
    ├── SlotTaken                   another event already holds an outbox event's slot (a conflict)
    ├── NewerThanKnown              a redelivered event's version is newer than the consumer knows
    ├── ArchiveFormatError          (ValueError) a key, part or line not in the archive's format
    ├── ArchiveStoreError           the object store refused or failed an operation
    │   └── ObjectMissing           (KeyError) no object under that key
    ├── ClassifierError             the overlap classifier gave no usable answer
    │   └── ClassifierTimeout       the overlap classifier did not answer in time
    ├── UpcastFailed                an upcaster raised reading an event as a newer version
    ├── RouterInputError            (ValueError) an event the causal router cannot fold
    ├── ProjectorInputError         (ValueError) an event lacks what the project view needs
    ├── PointError                  (ValueError) not a valid metric point (or query of points)
    ├── EffectsDiverged             (AssertionError) rhumbatron.testing: a replay left other effects
    ├── ChangelogNotSent            the analytics rollup's table changes were not written in time
    ├── ViewNotFound                a project has no view in that environment (yet)
    ├── CommandExpired              a command's deadline passed before it ran (dead-lettered)
    ├── LedgerDrillFailure          a failure a drill injects into the ledger subscription
    ├── HandlerDrillFailure         a failure a drill injects into a command handler
    ├── HandlerTimeout              a command handler ran past its queue's handler_timeout_s
    ├── HandlersAbandoned           too many timed-out handlers still running: the worker exits
    ├── HandlerHTTPError            an HTTP handler's request failed, or its reply was malformed
    ├── OperatorError               the operator service refused; ``status`` is its HTTP status
    │   ├── NotFound                404: no dead letter / project view with that id
    │   ├── Conflict                409: the letter is not open, or cannot be retried
    │   ├── BadInput                422: an argument was refused (names the field)
    │   └── ActionFailed            503: a retry could not be sent; the letter is open again
    ├── Refused                     the operator API: a change without the operator token
    └── PumpError                   the feed pump stopped (docs/pump.md); nothing after it published
        ├── FeedIdentityError       a feed page's corpus id and lineage missing, malformed or not ours
        ├── FeedLineRejected        a feed line refused (names its line, sequence and reason)
        ├── FeedUnavailable         the feed did not answer usably (refused, timed out, 5xx)
        ├── CheckpointError         a stored pump checkpoint that is not a valid one
        └── LegacyCheckpointAmbiguous  a bare legacy sequence with no attested corpus and lineage

    InternalSignal                  root of control-flow signals: caught where they steer
    ├── MoreWork                    a command handler asks for another delivery of its command
    ├── Retry                       a command handler's failed attempt, retried (after a delay)
    ├── Fail                        a command handler's permanent failure: no further attempt
    ├── LetterBeingRetried          the dead-letter consumer asks to read a record again later
    ├── CommittedUnknown            the group's committed offsets cannot be known yet: ask later
    ├── StatementsFailed            a SQL effect's statements failed for some events: judge them failed
    ├── PipelineBroken              the SQL store's pipelined statements met an event's error: one by one
    ├── Rejected                    carries what a processor's validate raised: the event is refused
    ├── ClaimsFound                 a commit not looked up first met claims: look them up, again
    └── ProcessorError              carries a processor's exception (and its step) to the runner

    SimulatedCrash                  (BaseException, under neither root) the in-memory harness's
                                    stand-in for a process death: no ``except Exception`` stops it

Library errors (librdkafka, redis-py, sqlite3, OSError of our own files, a settings value pydantic
refused) are translated at the boundary into these, with the context a reader needs, and chained
with ``raise ... from exc``. Inside the loops, where a retry policy handles an outage on purpose,
they are caught as they are.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:  # envelopes imports this module; the annotation needs no runtime import
    from streams.envelopes import Command, Event


class RhumbatronError(Exception):
    """Root of every error this project raises on purpose."""


class InternalSignal(Exception):
    """Root of the exceptions our code raises to steer itself and catches again (never an error a
    user sees). Deliberately not a :class:`RhumbatronError`, so catching errors never eats one."""


class EnvelopeError(RhumbatronError, ValueError):
    """An envelope is invalid. ``field`` is the wire (camelCase) name, ``value`` what was there."""

    def __init__(self, kind: str, field: str, value: object, reason: str) -> None:
        self.kind = kind
        self.field = field
        self.value = value
        self.reason = reason
        shown = repr(value)
        if len(shown) > 120:
            shown = shown[:117] + "..."
        super().__init__(f"invalid {kind}: field '{field}' = {shown}: {reason}")


class EnvelopeTooLarge(EnvelopeError):
    def __init__(self, kind: str, size: int, limit: int) -> None:
        self.size = size
        self.limit = limit
        super().__init__(
            kind,
            "<envelope>",
            f"{size} bytes",
            f"envelope is {size} bytes, over the {limit}-byte limit (max_envelope_bytes)",
        )


class TopologyError(RhumbatronError, ValueError):
    pass


class NotProvisioned(TopologyError):
    """Topics a runtime command needs do not exist. Runtime commands never create topics (that
    needs rights a consumer should not hold): ``rhumbatron provision`` does. ``missing`` are the
    names; ``listed`` is how the message shows them (compacted: ``…_00-07_dev``)."""

    def __init__(self, env: str, missing: Sequence[str], listed: str) -> None:
        self.env = env
        self.missing = list(missing)
        n = len(self.missing)
        super().__init__(
            f"environment '{env}' is not provisioned: missing {listed} ({n} topic"
            f"{'' if n == 1 else 's'}); run `rhumbatron provision` with an identity that may "
            "create topics"
        )


class ConfigurationError(RhumbatronError, ValueError):
    pass


class Unreachable(RhumbatronError, ConnectionError):
    """A server did not answer. ``service`` is 'Kafka' or 'Redis', ``address`` what we tried."""

    def __init__(self, service: str, address: str, detail: str) -> None:
        self.service = service
        self.address = address
        super().__init__(f"{service} at {address} is unreachable: {detail}")


class ServerRefused(RhumbatronError):
    """A server answered but refused the request (Redis: a wrong-type key, out of memory, a
    read-only replica …). ``service`` and ``address`` as for :class:`Unreachable`."""

    def __init__(self, service: str, address: str, detail: str) -> None:
        self.service = service
        self.address = address
        super().__init__(f"{service} at {address} refused the request: {detail}")


class KafkaLoginRefused(RhumbatronError):
    """Kafka answered, but the login failed: the broker refused the SASL credentials, or the TLS
    handshake failed (a CA that did not sign the broker's certificate, a name it does not carry).
    ``listener`` is the address with how the client logs in (protocol, mechanism, user), never
    a secret; ``detail`` is librdkafka's reason."""

    def __init__(self, listener: str, detail: str, *, tls: bool = False) -> None:
        self.listener = listener
        self.tls = tls
        what = "failed the TLS handshake" if tls else "refused the login"
        super().__init__(f"Kafka at {listener} {what}: {detail}")


@dataclass(frozen=True, slots=True)
class FailedRecord:
    topic: str
    key: str | None
    error: str
    retriable: bool
    fatal: bool


class DeliveryFailed(RhumbatronError):
    """Kafka did not accept some records. Nothing is dropped silently: each one is listed."""

    def __init__(self, failures: Sequence[FailedRecord]) -> None:
        self.failures = list(failures)
        first = self.failures[0] if self.failures else None
        detail = f"; first: {first.topic} key={first.key!r}: {first.error}" if first else ""
        super().__init__(f"{len(self.failures)} record(s) were not delivered{detail}")


class TransactionFailed(RhumbatronError):
    """A Kafka transaction did not commit. ``fenced`` means another instance took over the
    transactional id: this process must stop producing, not retry."""

    def __init__(
        self, transactional_id: str, detail: str, *, fenced: bool = False, abortable: bool = False
    ) -> None:
        self.transactional_id = transactional_id
        self.fenced = fenced
        self.abortable = abortable
        state = "fenced by a newer instance" if fenced else "aborted"
        super().__init__(f"transaction of '{transactional_id}' {state}: {detail}")


class OutboxError(RhumbatronError):
    """The outbox refused an operation; the message names the row, project or file concerned and
    what to do about it. Nothing was written."""


class SlotConflict(OutboxError):
    """A strict append named ``seen_slot`` but the project has moved on to ``head``. Nothing was
    written (the writer's own state change in that transaction rolled back too). ``missed`` holds
    the events on the slots after ``seen_slot`` (``missed_complete`` is False when that list was
    cut short), so the writer can merge them and decide again."""

    def __init__(
        self,
        project_id: str,
        seen_slot: int,
        head: int,
        missed: Sequence[Event] = (),
        *,
        missed_complete: bool = True,
    ) -> None:
        self.project_id = project_id
        self.seen_slot = seen_slot
        self.head = head
        self.missed = list(missed)
        self.missed_complete = missed_complete
        super().__init__(
            f"strict append to project '{project_id}' refused: the writer saw up to slot "
            f"{seen_slot} but the project is at slot {head} ({head - seen_slot} event(s) unseen); "
            "nothing was written. Merge the missed events, decide again, and append with "
            f"seen_slot={head}"
        )


class PublisherLocked(OutboxError):
    """A second publisher tried to start on an outbox that already has one."""

    def __init__(self, outbox: str, holder_pid: int | None, lock_path: str) -> None:
        self.outbox = outbox
        self.holder_pid = holder_pid
        holder = f"process {holder_pid}" if holder_pid else "another process"
        self.held_by = f"{holder} holds {lock_path}"
        super().__init__(
            f"outbox {outbox} already has a publisher ({self.held_by}); only one "
            "publisher may run per outbox: stop that one first, or publish a different outbox"
        )


class PublisherLeaseHeld(PublisherLocked):
    """A second publisher on a PostgreSQL outbox: the advisory lock is held by ``holder`` (its
    application name, backend pid and client address, as the server shows them)."""

    def __init__(self, outbox: str, holder: str, lock: str) -> None:
        self.outbox = outbox
        self.holder_pid = None
        self.holder = holder
        self.held_by = f"{holder} holds {lock}"
        OutboxError.__init__(
            self,
            f"outbox {outbox} already has a publisher ({self.held_by}); only one "
            "publisher may run per outbox: stop that one first, or publish a different outbox",
        )


class OutboxSchemaError(OutboxError):
    """A PostgreSQL outbox address whose database lacks the outbox schema, or holds another
    version of it than this release uses."""


# -- the subscription runtime ----------------------------------------------------------------------
# A partition is named by ``consumers.runtime.types.TP``; streams sits below consumers and cannot
# name that type, so the errors keep it as ``object`` and only print it.


class StoredRowInvalid(RhumbatronError, ValueError):
    """A stored outbox row the publisher cannot send (written by hand, or by another program, with
    a column of the wrong type or an envelope that does not agree with its columns); the message
    says what is wrong with it."""


class Fenced(RhumbatronError):
    """The caller no longer owns the partition: a newer owner bumped the epoch."""

    def __init__(self, tp: object, epoch: int, current: int) -> None:
        self.tp = tp
        super().__init__(
            f"write to {tp} refused: owner epoch {epoch} is stale (current {current}); "
            "another process owns the partition now"
        )


class LayoutNewer(RhumbatronError):
    """The state was moved to a layout this release does not speak (consumers.runtime.layout):
    it wrote nothing and must not write. A command exits with :data:`EXIT_CODE` for it, which the
    fleet does not restart."""

    EXIT_CODE = 78  # EX_CONFIG: starting again will not help

    def __init__(self, where: str, found: int, speaks: int) -> None:
        self.found = found
        self.speaks = speaks
        super().__init__(
            f"{where} is in state layout {found}, and this release speaks layouts up to "
            f"{speaks}: it wrote nothing and stops. `rhumbatron state migrate --finalize` moved "
            "the state forward, so a release that speaks it must run (rhumbatron --version "
            "shows the layout a release speaks); moving back is refused once finalized"
        )


class ReplicasBehind(RhumbatronError):
    """A Redis write reached its primary but not the ``replicas`` replicas ``WAIT`` asked for
    (``redis_wait_replicas``) within its timeout: a failover now could lose it, so the process
    does not go on from it (no Kafka offsets, no Kafka effects, no next batch). It ends the
    process like any Redis error in its loop; the partition's next owner redoes the batch, which
    the cursor's compare-and-set and the claims make exact."""

    def __init__(self, address: str, replicas: int, timeout_ms: int, acknowledged: int) -> None:
        super().__init__(
            f"Redis {address}: {acknowledged} of {replicas} replicas acknowledged the commit "
            f"within {timeout_ms} ms (RHUMBATRON_REDIS_WAIT_REPLICAS, "
            "RHUMBATRON_REDIS_WAIT_TIMEOUT_MS); the batch is redone by the partition's next "
            "owner. Check the replicas' link (INFO replication), or lower "
            "RHUMBATRON_REDIS_WAIT_REPLICAS"
        )
        self.replicas = replicas
        self.acknowledged = acknowledged


class InstanceIdHeld(RhumbatronError):
    """KIP-848 (``group.protocol=consumer``): the consumer group still holds this process's
    ``group.instance.id`` for an earlier process that did not leave (killed, crashed), until its
    session expires; librdkafka makes the consumer unusable (UNRELEASED_INSTANCE_ID, fatal).
    A command exits with :data:`EXIT_CODE` for it, which the fleet waits out."""

    EXIT_CODE = 75  # EX_TEMPFAIL: try again later

    # The broker's text for UNRELEASED_INSTANCE_ID; librdkafka reports it as a bare _FATAL.
    BROKER_TEXT = "instance ID is still used by another member"

    def __init__(self, said: str) -> None:
        super().__init__(
            f"group.instance.id still held by an earlier process of it in the group ({said}); "
            "under group_protocol 'consumer' the broker keeps it until that process's session "
            "expires (group.consumer.session.timeout.ms, 45 s by default): start again after it"
        )


class CursorMoved(RhumbatronError):
    """The cursor is not where the caller read it (compare-and-set failed)."""

    def __init__(self, tp: object, expected: tuple[int, int], found: tuple[int, int]) -> None:
        self.tp = tp
        self.expected = expected
        self.found = found
        super().__init__(
            f"cursor of {tp} moved: expected acked_through={expected[0]} revision={expected[1]}, "
            f"found acked_through={found[0]} revision={found[1]}"
        )


class PendingEffects(RhumbatronError):
    """New Kafka effects may not be stored while earlier ones are not known to be published."""

    def __init__(self, tp: object) -> None:
        self.tp = tp
        super().__init__(
            f"{tp} still has pending Kafka effects; recover them before committing new ones"
        )


class ProducerLeaseLost(RhumbatronError):
    """The lease on this process's transactional-id number was not renewed in time and may be
    another process's now: producing under it could fence that one, so this process stops."""


class TransactionsOpen(RhumbatronError):
    """A transaction open when the read started stayed open for the whole wait."""


class ControlRefused(RhumbatronError):
    """An operator control (reset, reprocess, re-reduce …) was refused; nothing was changed."""


class ArchiveIncomplete(ControlRefused):
    """The archive cannot supply every offset asked for; the message says which and why."""


class DeadLetterActionRefused(RhumbatronError):
    """A retry or dismiss of a dead letter was refused (unknown id, wrong status, no reason)."""


class AuditNotDurable(RhumbatronError):
    """The durable copy of an audit entry (the audit topic) did not take it: the action the entry
    records was not done, and Redis was left as it was."""


class NewerThanKnown(RhumbatronError):
    """An operator's retry of a dead letter brought an event of a version newer than the
    subscription's code knows: it fails (and is dead-lettered again) rather than being read by
    code written for an older version. A stream copy of such an event parks its project
    instead (consumers.runtime.parking)."""

    def __init__(self, event_id: str, event_type: str, version: int, known: int) -> None:
        self.event_id, self.event_type, self.version, self.known = (
            event_id,
            event_type,
            version,
            known,
        )
        super().__init__(
            f"event {event_id} is {event_type}@{version}, but this consumer knows "
            f"{event_type} up to @{known}: upgrade the consumer, then retry the dead letter"
        )


# -- the subscriptions -----------------------------------------------------------------------------


class ArchiveFormatError(RhumbatronError, ValueError):
    """A key, part or line is not in the archive's format; the message names what and where."""


class ArchiveStoreError(RhumbatronError):
    """The object store refused or failed an operation; the message names the key and store."""


class ObjectMissing(ArchiveStoreError, KeyError):
    def __init__(self, key: str, where: str) -> None:
        self.key = key
        super().__init__(f"no object {key!r} in {where}")

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0])


class ClassifierError(RhumbatronError):
    """The classifier gave no usable answer (status, body, connection)."""


class ClassifierTimeout(ClassifierError):
    """The classifier did not answer within its timeout."""


class UpcastFailed(RhumbatronError):
    """An upcaster raised: the event cannot be read as the version the code knows."""

    def __init__(self, event_type: str, event_id: str, version: int, cause: Exception) -> None:
        self.event_type = event_type
        self.version = version
        super().__init__(
            f"{event_type} {event_id}: the upcaster from version {version} to {version + 1} "
            f"raised {type(cause).__name__}: {cause}; fix the upcaster (docs/contract.md), "
            "then retry the event's dead letter"
        )


class RouterInputError(RhumbatronError, ValueError):
    """A consumed event the router cannot fold: names the event, the field and what was there."""

    def __init__(self, event: Event, field: str, value: object, expected: str) -> None:
        shown = repr(value)
        if len(shown) > 120:
            shown = shown[:117] + "..."
        super().__init__(
            f"{event.event_type} {event.event_id}: {field} = {shown}: expected {expected} "
            "(docs/router.md); the event is not folded"
        )


class ProjectorInputError(RhumbatronError, ValueError):
    """An event lacks what the view needs from it; names the event, the field and the value."""

    def __init__(self, event: Event, field: str, value: object, reason: str) -> None:
        self.event_id = event.event_id
        self.field = field
        super().__init__(
            f"{event.event_type} {event.event_id} (project {event.project_id!r}): "
            f"field '{field}' = {value!r}: {reason}"
        )


class PointError(RhumbatronError, ValueError):
    """A record on the points topic that is not a valid metric point."""


class ChangelogNotSent(RhumbatronError):
    """The analytics rollup could not write its table changes to their changelog before a
    commit or an abort: it stops rather than commit offsets past them."""


class ViewNotFound(RhumbatronError):
    def __init__(self, project_id: str, env: str, tp: object, slug: str) -> None:
        self.project_id = project_id
        super().__init__(
            f"project {project_id!r} has no view in environment {env!r} (looked in {tp}); "
            f"either no event of it was published there, or {slug} has not consumed it yet "
            f"(rhumbatron consume --subscription {slug})"
        )


class LedgerDrillFailure(RhumbatronError):
    """The failure a drill injects on purpose into the ledger subscription."""


# -- command workers -------------------------------------------------------------------------------


class CommandExpired(RhumbatronError):
    def __init__(self, command: Command, now: datetime) -> None:
        super().__init__(
            f"command {command.command_id} expired: deadline {command.deadline} passed at {now}"
        )


class HandlerDrillFailure(RhumbatronError):
    """The failure a drill injects on purpose into a command handler."""


class HandlerTimeout(RhumbatronError):
    """A handler ran past its queue's ``handler_timeout_s``: the attempt failed (retried like
    any failure); the handler's thread is abandoned, and what it sends after is refused."""


class HandlerHTTPError(RhumbatronError):
    """An HTTP handler's request got no usable answer (refused, timed out, TLS, a 5xx) or a 2xx
    whose body is not the reply the contract allows: a failed attempt."""


class HandlersAbandoned(RhumbatronError):
    """As many timed-out handlers as ``max_abandoned_handlers`` are still running: their threads
    cannot be stopped, so the worker exits for its supervisor to start a fresh process."""


# -- the operator service and its HTTP API ---------------------------------------------------------


class OperatorError(RhumbatronError):
    status: ClassVar[int] = 400


class NotFound(OperatorError):
    status = 404


class Conflict(OperatorError):
    status = 409


class BadInput(OperatorError):
    status = 422

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(message)


class ActionFailed(OperatorError):
    status = 503


class Refused(RhumbatronError):
    """A change was refused for want of the operator token."""

    def __init__(self, status: int, reason: str) -> None:
        self.status = status
        super().__init__(reason)


class PumpError(RhumbatronError):
    """The feed pump stopped; what it published before is checkpointed, nothing after."""


class FeedIdentityError(PumpError):
    """A page's authoritative pair is missing, malformed, or not the checkpoint's."""


class FeedLineRejected(PumpError):
    """A feed line the pump refuses: the lines before it are published, nothing from it on."""

    def __init__(self, line: int, sequence: int | None, reason: str) -> None:
        self.line = line
        self.sequence = sequence
        self.reason = reason
        at = f"sequence {sequence}" if sequence is not None else "unknown sequence"
        super().__init__(f"feed line {line} ({at}) refused: {reason}")


class FeedUnavailable(PumpError):
    """The feed could not be read (connection refused, timeout, a 5xx): worth another try."""


class CheckpointError(PumpError):
    """A stored checkpoint that does not parse as version 1 (or a legacy value that is not a
    sequence)."""


class LegacyCheckpointAmbiguous(PumpError):
    """A bare legacy sequence, and no operator-attested corpus id and lineage for it."""


# -- control-flow signals --------------------------------------------------------------------------


class MoreWork(InternalSignal):
    """Raised by a handler whose command has more work: deliver it again (at most
    ``max_command_deliveries`` deliveries in all; the last one is acknowledged)."""


class Retry(InternalSignal):
    """Raised by a handler: this attempt failed, try again within the queue's ``retries``.
    ``delay_s`` asks for a wait before the next attempt (None: the queue's own retry delay); it is
    rounded up to the next retry tier (``retry_tiers_s``) and capped by ``max_retry_delay_s`` and
    the command's deadline. ``reason`` is what the retry, or the dead letter after the last
    attempt, says."""

    def __init__(self, delay_s: float | None = None, reason: str = "") -> None:
        if delay_s is not None and not delay_s >= 0:  # NaN too
            raise ValueError(f"Retry(delay_s={delay_s!r}): must be None or a number >= 0")
        self.delay_s = delay_s
        self.reason = reason
        super().__init__(reason or "retry requested")


class Fail(InternalSignal):
    """Raised by a handler: the command cannot succeed, whatever the attempt. No further attempt:
    it is dead-lettered now with ``reason`` (on a queue without a dead-letter queue, handed to the
    queue's ``on_exhausted`` path like any last failure)."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


class LetterBeingRetried(InternalSignal):
    """The letter is mid-retry (an operator's send in flight): try this record again later. The
    worker's retry path takes it like any handler failure, so the record comes back after the
    queue's delay."""


class CommittedUnknown(InternalSignal):
    """The group's committed offsets cannot be known right now (an open transaction); recovery
    asks again on a later loop."""


class StatementsFailed(InternalSignal):
    """A SQL-effect commit met errors of its events' own statements (SQLSTATE classes 22, 23,
    42 …: a constraint, a bad value, a bad statement): nothing of it was written. ``failures``
    maps each failing event id to its error; the runner processes the batch again with those
    events failed (their projects held back behind them) and commits that."""

    def __init__(self, tp: object, failures: Mapping[str, BaseException]) -> None:
        self.tp = tp
        self.failures = dict(failures)
        shown = ", ".join(f"{e}: {type(x).__name__}" for e, x in list(self.failures.items())[:3])
        super().__init__(f"{tp}: statements of {len(self.failures)} events failed ({shown})")


class ClaimsFound(InternalSignal):
    """A commit whose claims the caller did not look up first (``Commit.looked`` false) met a
    claim of one of its events already stored: nothing of it was written. The runner looks the
    batch's claims up and processes it again, as a batch with duplicates always was."""

    def __init__(self, tp: object) -> None:
        self.tp = tp
        super().__init__(f"{tp}: a commit not looked up first met stored claims")


class SlotTaken(RhumbatronError):
    """An outbox event whose slot a subscription already holds for another event: two outboxes
    sharing an identity, or an outbox whose slots were numbered again (a database restored
    under a new one). Dead-lettered at once; an operator's retry applies it anyway."""

    def __init__(self, event_id: str, project_id: str, outbox: str, slot: int) -> None:
        super().__init__(
            f"slot {slot} of project {project_id} from outbox {outbox} is already claimed by "
            f"another event than {event_id}: the outbox's slots were numbered twice (two "
            "outboxes with one identity, or a restored database); dead-lettered, retry it to "
            "apply it anyway"
        )


class Rejected(InternalSignal):
    """What a processor's ``validate`` raised: the event is bad input, dead-lettered at once
    with ``cause`` as the reason; the runner unwraps it at once."""

    def __init__(self, cause: BaseException) -> None:
        self.cause = cause
        super().__init__(f"validate refused the event: {type(cause).__name__}: {cause}")


class ProcessorError(InternalSignal):
    """Wraps what a processor raised, keeping which step (reduce or process) it came from; the
    runner unwraps it at once and records ``cause``, not the wrapper."""

    def __init__(self, step: str, cause: BaseException) -> None:
        self.step = step
        self.cause = cause
        super().__init__(f"{step} raised {type(cause).__name__}: {cause}")


class EffectsDiverged(RhumbatronError, AssertionError):
    """``rhumbatron.testing.assert_exactly_once``: a replay (``trial``) left other effects or
    folds than the clean run, or applied something twice; ``aspect`` names what differed."""

    def __init__(self, message: str, trial: Any, aspect: str) -> None:
        super().__init__(message)
        self.trial = trial
        self.aspect = aspect


class PipelineBroken(InternalSignal):
    """The SQL store's pipelined statements of one call met an error of an event's own: the
    call starts again with the commit at ``index`` run one event at a time, each under a
    savepoint, to find which events failed."""

    def __init__(self, index: int) -> None:
        super().__init__(index)
        self.index = index


class SimulatedCrash(BaseException):
    """The in-memory harness's stand-in for a process dying at a fail-point. Deliberately under
    neither root: it must pass every ``except Exception`` of the runtime, as a real death
    would."""
