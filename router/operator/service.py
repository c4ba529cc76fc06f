"""The operator service: the one code the three faces call — ``rhumbatron dead-letters …`` (CLI),
the HTTP API and the web page (``rhumbatron serve``).

It reads and acts on what the other parts keep: the one dead-letter store (event batches, poison
records and commands; retry and dismiss through :class:`DeadLetterActions`, one letter or every
letter a filter matches, each audited naming its operator), the outboxes' figures
(``streams.outbox.ops.stats``), consumer lag (``consumers.lag``, computed there only), the project
views (``consumers.subscriptions.projector.view``) and the reachability of Kafka and Redis.

Errors a caller can act on are typed (``OperatorError`` and its subclasses in ``streams.errors``,
each with its HTTP ``status``), so each face maps them once.

Kafka or Redis being down surfaces as ``streams.errors.Unreachable`` (503 over HTTP).
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterable
from dataclasses import asdict
from pathlib import Path
from typing import Any, TypeVar

import redis
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient
from pydantic import TypeAdapter, ValidationError

from consumers.lag import group_lag, list_groups
from consumers.redis_conn import address_of
from consumers.runtime.dead_letter_ops import DeadLetterActions
from consumers.runtime.dead_letters import DeadLetter, DeadLetterStore, LetterKind, LetterStatus
from consumers.runtime.types import TP
from consumers.subscriptions.projector.view import read_feed, read_view
from router import fleet
from router.operator.models import (
    ActionResult,
    BulkLetter,
    BulkResult,
    DeadLetterDetail,
    DeadLetterFilter,
    DeadLetterList,
    FailedRow,
    FleetMemberBody,
    FleetReport,
    Health,
    HeldProjectBody,
    Info,
    LagReport,
    OutboxReport,
    PartitionLagBody,
    Probe,
    RecentFailures,
    Session,
    SubscriptionLag,
    bulk_row_of,
    detail_of,
    summary_of,
)
from router.operator.selection import Selection
from router.settings import Settings
from streams.admin import admin_client, ensure_reachable
from streams.clock import Clock, SystemClock
from streams.envelopes import Name
from streams.errors import (
    ActionFailed,
    AuditNotDurable,
    BadInput,
    Conflict,
    DeadLetterActionRefused,
    NotFound,
    RhumbatronError,
    Unreachable,
    ViewNotFound,
)
from streams.kafka_config import bootstrap_of
from streams.outbox import ops
from streams.topology import queue_name, redelivery_topic
from streams.urls import masked

_PROJECT_ID: TypeAdapter[str] = TypeAdapter(Name)
T = TypeVar("T")
# What each bulk action takes by default: the statuses it can act on.
_ACTIONABLE = {
    "retry": (LetterStatus.OPEN, LetterStatus.RETRYING),
    "dismiss": (LetterStatus.OPEN,),
}


def write_tokens(settings: Settings) -> dict[str, str]:
    """Each operator's name and write token, for those configured (operator_token under
    operator_token_name, and operator_tokens)."""
    named = {settings.operator_token_name: settings.operator_token, **settings.operator_tokens}
    return {
        name: token.get_secret_value()
        for name, token in named.items()
        if token is not None and token.get_secret_value()
    }


class OperatorService:
    """Thread-safe: the HTTP face calls it from a pool of threads. Redis and Kafka clients are
    made on first use, so the service (and the page) comes up while either is down and says so.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        clock: Clock | None = None,
        actions: DeadLetterActions | None = None,
    ) -> None:
        self.settings = settings
        self.clock = clock or SystemClock()
        self._actions = actions
        self._client: redis.Redis[bytes] | None = None
        self._admin: AdminClient | None = None
        self._build = threading.Lock()
        # One operator action at a time: the actions' producer keeps one list of failed sends.
        self._acting = threading.Lock()

    # -- parts, made on first use ------------------------------------------------------------
    def redis(self) -> redis.Redis[bytes]:
        with self._build:
            if self._client is None:
                from router.wiring.subscription import redis_client

                self._client = redis_client(self.settings)
            return self._client

    def actions(self) -> DeadLetterActions:
        if self._actions is None:
            client = self.redis()
            with self._build:
                if self._actions is None:
                    from router.wiring.state import ensure_state
                    from router.wiring.subscription import dead_letter_actions

                    # This process owns the index: a Redis that came back empty gets it back
                    # (and the audit logs) from the audit topic before anything reads it.
                    ensure_state(self.settings, client)
                    self._actions = dead_letter_actions(self.settings, client, self.clock)
        return self._actions

    def letters(self) -> DeadLetterStore:
        return self.actions().store

    def admin(self) -> AdminClient:
        with self._build:
            if self._admin is None:
                self._admin = admin_client(self.settings.kafka_config())
            return self._admin

    def close(self) -> None:
        if self._client is not None:
            self._client.close()

    # -- dead letters --------------------------------------------------------------------------
    def list_dead_letters(
        self,
        *,
        status: str | None = None,
        kind: str | None = None,
        subscription: str | None = None,
        queue: str | None = None,
        since: str | None = None,
        limit: int | None = None,
    ) -> DeadLetterList:
        """Newest first, filtered; at most ``limit`` (default and ceiling: operator_page_size)."""
        page = self._limit(limit)
        chosen = Selection.of(
            self.clock,
            status=status,
            kind=kind,
            subscription=subscription,
            queue=queue,
            since=since,
            queues=self.settings.topology.queues,
        )
        statuses = None if chosen.status is None else (chosen.status,)
        fetched, truncated = self._scan(statuses)
        matched = [d for d in fetched if chosen.holds(d)]
        matched.sort(key=lambda d: (d.created_at, d.id), reverse=True)
        return DeadLetterList(
            items=[summary_of(d) for d in matched[:page]],
            matched=len(matched),
            truncated=truncated,
        )

    def _scan(self, statuses: Iterable[LetterStatus] | None) -> tuple[list[DeadLetter], bool]:
        """The store's letters of those statuses (None: all), at most
        operator_dead_letter_scan_limit of each, and whether that bound was reached."""
        scan = self.settings.operator_dead_letter_scan_limit
        store = self.letters()
        found: list[DeadLetter] = []
        truncated = False
        for status in statuses if statuses is not None else (None,):
            part = store.list(status=status, limit=scan, newest_first=True)
            truncated = truncated or len(part) >= scan
            found += part
        return found, truncated

    def dead_letter(self, letter_id: str) -> DeadLetterDetail:
        return detail_of(self._letter(letter_id))

    def retry(self, letter_id: str, *, who: str, reason: str | None = None) -> ActionResult:
        """Event letters go back to their subscription alone (its redelivery topic); a command
        goes back to its origin queue, once: a second retry is a :class:`Conflict`."""
        operator = self._text("who", who)
        why = self._text("reason", reason, required=False) or "operator retry"
        with self._acting:
            letter = self._letter(letter_id)
            refusal = self._why_not(letter, "retry")
            if refusal is not None:
                raise Conflict(refusal)
            try:
                done = self.actions().retry(letter_id, who=operator, why=why)
            except AuditNotDurable as exc:
                raise ActionFailed(str(exc)) from exc
            except DeadLetterActionRefused as exc:
                if exc.__cause__ is not None:  # the send failed; the letter is open again
                    raise ActionFailed(str(exc)) from exc
                raise Conflict(str(exc)) from exc
        return ActionResult(dead_letter=detail_of(done), outcome=self._retried(done))

    def dismiss(self, letter_id: str, *, who: str, reason: str) -> ActionResult:
        operator = self._text("who", who)
        why = self._text("reason", reason)
        with self._acting:
            letter = self._letter(letter_id)
            refusal = self._why_not(letter, "dismiss")
            if refusal is not None:
                raise Conflict(refusal)
            try:
                done = self.actions().dismiss(letter_id, who=operator, why=why)
            except AuditNotDurable as exc:
                raise ActionFailed(str(exc)) from exc
            except DeadLetterActionRefused as exc:
                raise Conflict(str(exc)) from exc
        return ActionResult(dead_letter=detail_of(done), outcome=f"dismissed by {operator}: {why}")

    def _why_not(self, letter: DeadLetter, action: str) -> str | None:
        """Why ``letter`` cannot take ``action`` (retry, dismiss) now, or None: the one rule of
        the single and the bulk actions."""
        if action == "retry" and self.actions().is_stale_retry(letter):
            pass  # its sender died mid-send: the retry may be taken over
        elif letter.status != LetterStatus.OPEN:
            last = letter.audit[-1] if letter.audit else None
            by = (
                f" ({last['action']} by {last['who']} at {last['at']}: {last['why']})"
                if last
                else ""
            )
            done = "retried" if action == "retry" else "dismissed"
            return (
                f"dead letter {letter.id} is {letter.status}, not open: it was already handled"
                f"{by}; only an open letter can be {done}"
            )
        if action == "retry" and letter.kind == LetterKind.POISON:
            return (
                f"dead letter {letter.id} holds bytes that are not a valid event; it can only be "
                "dismissed (fix the producer, then dismiss it with a reason)"
            )
        return None

    # -- bulk actions --------------------------------------------------------------------------
    def bulk_retry(
        self,
        chosen: DeadLetterFilter,
        *,
        dry_run: bool,
        operator: str,
        reason: str | None = None,
    ) -> BulkResult:
        """Retry every letter ``chosen`` matches, each through :meth:`retry` (so each is audited
        on its own, and one handled by someone else meanwhile is skipped, not retried twice)."""
        why = self._text("reason", reason, required=False) or None
        return self._bulk(
            "retry",
            chosen,
            dry_run,
            self._text("who", operator),
            lambda letter_id, who: self.retry(letter_id, who=who, reason=why),
        )

    def bulk_dismiss(
        self, chosen: DeadLetterFilter, *, dry_run: bool, operator: str, reason: str
    ) -> BulkResult:
        """Dismiss every letter ``chosen`` matches, each through :meth:`dismiss`."""
        why = self._text("reason", reason)
        return self._bulk(
            "dismiss",
            chosen,
            dry_run,
            self._text("who", operator),
            lambda letter_id, who: self.dismiss(letter_id, who=who, reason=why),
        )

    def _bulk(
        self,
        action: str,
        chosen: DeadLetterFilter,
        dry_run: bool,
        operator: str,
        act: Callable[[str, str], ActionResult],
    ) -> BulkResult:
        selection = Selection.of(
            self.clock, **chosen.model_dump(), queues=self.settings.topology.queues
        )
        allowed = _ACTIONABLE[action]
        if selection.status is not None and selection.status not in allowed:
            raise BadInput(
                "status",
                f"status {selection.status.value!r}: a bulk {action} acts on "
                f"{' or '.join(s.value for s in allowed)} letters only",
            )
        fetched, truncated = self._scan((selection.status,) if selection.status else allowed)
        matched = sorted(
            (d for d in fetched if selection.holds(d)), key=lambda d: (d.created_at, d.id)
        )
        limit = self.settings.operator_bulk_limit
        done = "retried" if action == "retry" else "dismissed"
        rows: list[BulkLetter] = []
        acted = skipped = failed = untouched = 0
        untouched_reason: str | None = None
        for letter in matched:
            refusal = self._why_not(letter, action)
            if refusal is not None:
                skipped += 1
                rows.append(bulk_row_of(letter, "skipped", refusal))
                continue
            if failed or acted >= limit:
                untouched += 1
                continue
            if dry_run:
                acted += 1
                rows.append(
                    bulk_row_of(letter, f"would {action}", f"would be {done} by {operator}")
                )
                continue
            try:
                result = act(letter.id, operator)
            except (Conflict, NotFound) as exc:  # handled (or gone) since it was matched
                skipped += 1
                rows.append(bulk_row_of(letter, "skipped", str(exc)))
            except (ActionFailed, Unreachable) as exc:
                failed += 1
                rows.append(bulk_row_of(letter, "failed", str(exc)))
            else:
                acted += 1
                rows.append(bulk_row_of(letter, result.dead_letter.status, result.outcome))
        if untouched:
            untouched_reason = (
                "the run stopped at the failed letter: fix the cause, then run it again"
                if failed
                else f"over operator_bulk_limit ({limit}) letters per call: run it again for the "
                "next ones"
            )
        return BulkResult(
            action=action,
            dry_run=dry_run,
            operator=operator,
            matched=len(matched),
            acted=acted,
            skipped=skipped,
            failed=failed,
            untouched=untouched,
            untouched_reason=untouched_reason,
            limit=limit,
            truncated=truncated,
            letters=rows,
        )

    def _letter(self, letter_id: str) -> DeadLetter:
        letter = self.letters().get(letter_id)
        if letter is None:
            raise NotFound(
                f"no dead letter with id {letter_id!r} in environment {self.settings.env!r} "
                "(rhumbatron dead-letters list shows the ids)"
            )
        return letter

    def _retried(self, letter: DeadLetter) -> str:
        env = self.settings.env
        if letter.kind == LetterKind.COMMAND and letter.origin_queue:
            return (
                f"command {letter.command_id} sent back to its origin queue "
                f"{queue_name(letter.origin_queue, env)}"
            )
        n = sum(1 for e in letter.entries if e.value is not None)
        sub = letter.subscription or "?"
        return (
            f"{n} event(s) redelivered to subscription {sub} alone "
            f"(through {redelivery_topic(sub, env) if letter.subscription else '?'})"
        )

    def _limit(self, limit: int | None) -> int:
        ceiling = self.settings.operator_page_size
        if limit is None:
            return ceiling
        if not 1 <= limit <= ceiling:
            raise BadInput(
                "limit", f"limit {limit} is out of range 1..{ceiling} (operator_page_size)"
            )
        return limit

    def _text(self, field: str, value: str | None, *, required: bool = True) -> str:
        text = (value or "").strip()
        if required and not text:
            raise BadInput(
                field,
                f"{field} is required and may not be blank: it goes to the audit log",
            )
        cap = self.settings.operator_text_max_chars
        if len(text) > cap:
            raise BadInput(
                field, f"{field} is {len(text)} characters, over {cap} (operator_text_max_chars)"
            )
        return text

    # -- outboxes ------------------------------------------------------------------------------
    def outbox_paths(self) -> list[Path | str]:
        """The outboxes reported: a SQLite file as a Path, a PostgreSQL outbox as its URL."""
        from router.wiring.causal import router_outbox_path
        from streams.outbox.store import is_postgres_url

        # Unset: the router's outbox and those the fleet publishes (fleet_outboxes).
        named = self.settings.operator_outboxes or [
            str(router_outbox_path(self.settings)),
            *self.settings.fleet_outboxes,
        ]
        return [p if is_postgres_url(p) else Path(p) for p in dict.fromkeys(named)]

    def outboxes(self) -> list[OutboxReport]:
        return [self._outbox(path) for path in self.outbox_paths()]

    def _outbox(self, path: Path | str) -> OutboxReport:
        limit = self.settings.outbox_stats_row_limit
        # A PostgreSQL outbox's URL is a secret: the report names it without its password.
        shown = masked(path) if isinstance(path, str) else str(path)
        if isinstance(path, Path) and not path.exists():
            return OutboxReport(outbox=shown, present=False, lists_truncated_at=limit)
        from router.wiring.outbox import open_outbox

        try:
            store = open_outbox(self.settings, path, create=False)
            try:
                found = ops.stats(store, now=self.clock.now().timestamp(), row_limit=limit)
            finally:
                store.close()
        except (RhumbatronError, sqlite3.Error) as exc:
            return OutboxReport(
                outbox=shown,
                present=True,
                error=f"{type(exc).__name__}: {exc}",
                lists_truncated_at=limit,
            )
        data = found.as_dict()
        where = data.pop("outbox")
        return OutboxReport(
            outbox=where,
            present=True,
            counts={state.value: n for state, n in found.counts.items()},
            total=data["total"],
            oldest_pending_age_s=data["oldest_pending_age_s"],
            failed_rows=[FailedRow(outbox=where, **row) for row in data["failed_rows"]],
            held_projects=[HeldProjectBody(outbox=where, **h) for h in data["held_projects"]],
            lists_truncated_at=limit,
        )

    def held_projects(self) -> list[HeldProjectBody]:
        return [held for report in self.outboxes() for held in report.held_projects]

    def recent_failures(self) -> RecentFailures:
        n = self.settings.operator_recent_failures
        letters = self.list_dead_letters(limit=min(n, self.settings.operator_page_size))
        rows = [row for report in self.outboxes() for row in report.failed_rows]
        return RecentFailures(dead_letters=letters.items, outbox_failed_rows=rows[:n])

    # -- consumer lag --------------------------------------------------------------------------
    def lag(self) -> LagReport:
        """Every consumer group of the environment (``rhumbatron-<slug>-<env>``), per partition of
        the topics it reads (``router.wiring.groups``): the streams (and, where it committed
        there, its redelivery topic) for a subscription, its queue and retry topic for a command
        worker. A partition of those it never committed lags by all it holds."""
        from router.wiring.groups import group_reads

        settings = self.settings
        env = settings.env
        base = settings.kafka_config()
        admin = self.admin()
        timeout = settings.connect_timeout_s
        out = []
        ensure_reachable(admin, base, timeout)
        listing = (admin, "rhumbatron-", f"-{env}", timeout)
        for group in _kafka(base, "listing consumer groups", list_groups, *listing):
            reads = group_reads(settings.topology, group)
            parts = _kafka(base, f"lag of {group}", group_lag, admin, base, reads, timeout)
            shown = [PartitionLagBody(**p.as_dict()) for p in parts]
            out.append(
                SubscriptionLag(
                    subscription=reads.name,
                    group=group,
                    kind=reads.kind,
                    total_lag=sum(p.lag for p in shown),
                    partitions=shown,
                )
            )
        return LagReport(env=env, subscriptions=out)

    # -- the fleet -------------------------------------------------------------------------------
    def fleet(self) -> FleetReport:
        """The fleet of the environment on this server's host (router/fleet.py): each member's
        state, pid, restarts, and a subscription member's partitions and lag."""
        settings = self.settings
        found, owned = _kafka(
            settings.kafka_config(), "describing the fleet's groups", fleet.current, settings
        )
        if found is None:
            return FleetReport(
                env=settings.env, state="none", pid=None, updated_at=None, members=[]
            )
        members = []
        for m in found.members:
            got = owned.get(m.name)
            members.append(
                FleetMemberBody(
                    **asdict(m),
                    partitions=got.partitions if got else None,
                    lag=got.lag if got else None,
                )
            )
        return FleetReport(
            env=found.env,
            state=found.state,
            pid=found.pid,
            updated_at=found.updated_at,
            members=members,
        )

    # -- project views -------------------------------------------------------------------------
    def project_view(self, project_id: str) -> dict[str, Any]:
        tp = self._project_tp(project_id)
        try:
            return read_view(self.redis(), self.settings.env, tp, project_id)
        except ViewNotFound as exc:
            raise NotFound(str(exc)) from exc

    def project_feed(self, project_id: str) -> list[dict[str, Any]]:
        tp = self._project_tp(project_id)
        try:
            return read_feed(self.redis(), self.settings.env, tp, project_id)
        except ViewNotFound as exc:
            raise NotFound(str(exc)) from exc

    def _project_tp(self, project_id: str) -> TP:
        try:
            _PROJECT_ID.validate_python(project_id)
        except ValidationError as exc:
            problem = exc.errors(include_url=False)[0]["msg"]
            raise BadInput(
                "project_id", f"project_id {project_id[:200]!r} is not a project id: {problem}"
            ) from exc
        topic, partition = self.settings.topology.partition_of(project_id)
        return TP(topic, partition)

    # -- health --------------------------------------------------------------------------------
    def health(self) -> Health:
        settings = self.settings
        timeout = settings.operator_health_timeout_s
        base = settings.kafka_config()
        try:
            metadata = ensure_reachable(self.admin(), base, timeout)
            kafka = Probe(
                ok=True, address=bootstrap_of(base), detail=f"{len(metadata.brokers)} broker(s)"
            )
        except Unreachable as exc:
            kafka = Probe(ok=False, address=bootstrap_of(base), detail=str(exc))
        where = address_of(settings.redis_url)
        try:
            from router.wiring.subscription import redis_client

            probe = redis_client(settings, timeout=timeout)  # pings
            probe.close()
            store = Probe(ok=True, address=where, detail="answered PING")
        except Unreachable as exc:
            store = Probe(ok=False, address=where, detail=str(exc))
        down = [p.detail for p in (kafka, store) if not p.ok]
        return Health(
            ok=not down,
            env=settings.env,
            kafka=kafka,
            redis=store,
            reason="; ".join(down) or None,
        )

    def info(self) -> Info:
        return Info(
            env=self.settings.env,
            refresh_s=self.settings.operator_refresh_s,
            mutations_enabled=bool(write_tokens(self.settings)),
            page_size=self.settings.operator_page_size,
        )

    def session(self, operator: str | None) -> Session:
        """Who a caller is, as its token says: an operator by name, or the read token."""
        read_only = not write_tokens(self.settings)
        return Session(
            env=self.settings.env,
            operator=operator,
            can_act=operator is not None and not read_only,
            read_only=read_only,
        )


def _kafka(base: dict[str, Any], what: str, call: Callable[..., T], *args: Any) -> T:
    """A failed admin request becomes Unreachable, naming the address and the request."""
    try:
        return call(*args)
    except KafkaException as exc:
        raise Unreachable("Kafka", bootstrap_of(base), f"{what}: {exc}") from exc
