"""The analytics rollup: a faust-streaming app that reads the metric points topic into per-minute
tumbling-window tables — one per metric, one per project — and serves them over faust's HTTP web
views.

One stage, no repartition topic. Both tables are updated by the agent reading the points topic,
and every table key is written from one points partition only, so each table change goes to the
changelog partition of the point's own partition — the transaction that commits that partition's
offset under ``exactly_once``:

- ``by_project``: windows per project, each a ``{metric: count}`` object. The points topic is keyed
  by project, so a project's windows live with the worker owning the project's partition, and its
  view is routed there (``topic_route``).
- ``by_metric``: windows per ``(metric, points partition)``; the metric view adds up the
  partitions. A repartition by metric (``group_by``) would put one metric on one worker, but
  faust 0.15 sends a forwarded record in the transaction of its *destination* partition, not with
  the source offsets, and we measured points counted twice after a restart (docs/analytics.md).
  The view says which partitions it covers; ``rhumbatron analytics`` refuses a partial answer.
- Windows are by the point's ``time`` (the event's own timestamp), not by when the point was
  produced or read; a window expires a while after its end by wall-clock time (a setting).
- A point that does not parse is counted per partition (``invalid``), logged with its offset and
  the reason, and shown by the status view; it is never folded into a window.
- Traced (an SDK tracer provider installed), each point's fold is a CONSUMER span
  ``process <points topic>`` parented on the context the point carries (the analytics
  projector's apply of the event it counts), so the event's trace ends here; an invalid point's
  span records the reason, status ERROR.

faust's confluent-kafka driver does not work here (it never creates topics, and never polls before
its first assignment, so it never learns its assignment); the app uses aiokafka (``kafka://``).
It logs in as every other client does: :func:`rollup_security` reads the login and TLS settings
out of the librdkafka configuration the settings build, and :func:`broker_credentials` turns them
into faust's credentials (an ``ssl.SSLContext`` for TLS). OAUTHBEARER is refused: aiokafka needs a
token provider object for it, which a setting cannot give.
What the rollup guarantees, as measured against our broker, is in docs/analytics.md.
"""

from __future__ import annotations

import asyncio
import logging
import re
import ssl
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

import faust
import orjson
from faust.exceptions import ConsumerNotStarted
from faust.tables.wrappers import WindowWrapper
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP, EventT, StreamT
from faust.types.auth import CredentialsT
from faust.web import Request, Response, View
from faust.web.exceptions import ServiceUnavailable
from mode.utils.times import want_seconds
from opentelemetry import trace
from opentelemetry.trace import SpanKind, StatusCode

from consumers.subscriptions.analytics.projector import METRIC_NAMES
from streams import tracing as t
from streams.errors import ChangelogNotSent, ConfigurationError, PointError
from streams.topology import TopicSpec

log = logging.getLogger("rhumbatron.analytics.rollup")

_TIME = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$")


@dataclass(frozen=True, slots=True)
class Point:
    metric: str
    project_id: str
    timestamp: float  # seconds since the epoch, from the point's ``time``


def parse_point(raw: bytes | None) -> Point:
    """Read a point's JSON; raise :class:`PointError` naming what is wrong with it."""
    if raw is None:
        raise PointError("empty record (no value)")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise PointError(f"not JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise PointError(f"expected a JSON object, got {type(body).__name__}")
    metric = body.get("metric")
    if metric not in METRIC_NAMES:
        raise PointError(f"unknown metric {metric!r}")
    project = body.get("projectId")
    if not isinstance(project, str) or not project:
        raise PointError(f"projectId must be a non-empty string, got {project!r}")
    time = body.get("time")
    if not isinstance(time, str) or not _TIME.match(time):
        raise PointError(f"time must be UTC as YYYY-MM-DDTHH:MM:SS.mmmZ, got {time!r}")
    value = body.get("value")
    if value != 1 or isinstance(value, bool):
        raise PointError(f"value must be 1, got {value!r}")
    stamp = datetime.fromisoformat(time).replace(tzinfo=UTC).timestamp()
    return Point(metric, project, stamp)


def _event_time(event: EventT[Any] | None) -> float:
    """Window placement: the point's own time. Only valid points reach the tables."""
    if event is None:
        raise RuntimeError("a window was touched outside stream processing")
    return parse_point(event.value).timestamp


TRACER = "rhumbatron.analytics.rollup"
METRIC = "rhumbatron.metric"
COUNTED = "counted"
INVALID = "invalid"


@contextmanager
def point_span(event: EventT[Any], group: str) -> Iterator[trace.Span | None]:
    """The CONSUMER span of one point's fold, current inside; None when tracing is off."""
    if not t.active():
        yield None
        return
    message = event.message
    raw = message.headers or ()
    headers = list(raw.items() if isinstance(raw, Mapping) else raw)
    key = message.key
    attributes: dict[str, str | int] = {
        t.MESSAGING_SYSTEM: t.KAFKA,
        t.OPERATION_TYPE: t.PROCESS,
        t.DESTINATION: message.topic,
        t.PARTITION: str(message.partition),
        t.OFFSET: message.offset,
        t.CONSUMER_GROUP: group,
    }
    if isinstance(key, bytes):
        attributes[t.MESSAGE_KEY] = key.decode("utf-8", "replace")
    span = t.tracer(TRACER).start_span(
        f"process {message.topic}",
        context=t.context_of(headers),
        kind=SpanKind.CONSUMER,
        attributes=attributes,
    )
    with trace.use_span(span, end_on_exit=True):
        yield span


def format_epoch(seconds: float) -> str:
    moment = datetime.fromtimestamp(seconds, UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


@dataclass(frozen=True, slots=True)
class RollupSecurity:
    """How the rollup logs in to Kafka: librdkafka's ``security.protocol``, ``sasl.*`` and
    ``ssl.*`` settings, as aiokafka needs them. Secrets are left out of the repr."""

    protocol: str = "PLAINTEXT"  # PLAINTEXT | SSL | SASL_PLAINTEXT | SASL_SSL
    mechanism: str | None = None  # PLAIN | SCRAM-SHA-256 | SCRAM-SHA-512
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    ca_file: str | None = None  # a file or a folder of CA certificates; None: the system's
    cert_file: str | None = None
    key_file: str | None = None
    key_password: str | None = field(default=None, repr=False)
    check_hostname: bool = True  # ssl.endpoint.identification.algorithm=https
    verify_certificate: bool = True  # enable.ssl.certificate.verification

    @property
    def uses_tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")


_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
_SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


def _text(value: Any) -> str | None:
    if value is None:
        return None
    reveal = getattr(value, "get_secret_value", None)  # a SecretStr that was not revealed
    return str(reveal() if callable(reveal) else value)


def _flag(value: Any, default: bool) -> bool:
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    return str(value).strip().lower() in ("true", "1", "yes")


def rollup_security(librdkafka: Mapping[str, Any]) -> RollupSecurity:
    """The rollup's login, from the librdkafka configuration every other client uses
    (``Settings.kafka_config()``), so the two can never disagree. Refuses, in one line, what
    aiokafka cannot do from settings alone: OAUTHBEARER (it needs a token provider object) and
    a mechanism or protocol it does not know."""
    protocol = (_text(librdkafka.get("security.protocol")) or "PLAINTEXT").upper()
    if protocol not in _PROTOCOLS:
        raise ConfigurationError(
            f"the analytics rollup cannot use security.protocol {protocol!r}; "
            f"it knows {', '.join(_PROTOCOLS)}"
        )
    mechanism = _text(librdkafka.get("sasl.mechanism", librdkafka.get("sasl.mechanisms")))
    if protocol.startswith("SASL_"):
        mechanism = (mechanism or "GSSAPI").upper()  # librdkafka's default mechanism
        if mechanism == "OAUTHBEARER":
            raise ConfigurationError(
                "the analytics rollup cannot log in with SASL OAUTHBEARER: aiokafka needs a token "
                "provider object, which settings cannot give; run the rollup with a PLAIN or "
                "SCRAM login (kafka_sasl_mechanism)"
            )
        if mechanism not in _SASL_MECHANISMS:
            raise ConfigurationError(
                f"the analytics rollup cannot log in with SASL {mechanism}; "
                f"it knows {', '.join(_SASL_MECHANISMS)}"
            )
    else:
        mechanism = None
    identification = _text(librdkafka.get("ssl.endpoint.identification.algorithm")) or "https"
    return RollupSecurity(
        protocol=protocol,
        mechanism=mechanism,
        username=_text(librdkafka.get("sasl.username")) if mechanism else None,
        password=_text(librdkafka.get("sasl.password")) if mechanism else None,
        ca_file=_text(librdkafka.get("ssl.ca.location")),
        cert_file=_text(librdkafka.get("ssl.certificate.location")),
        key_file=_text(librdkafka.get("ssl.key.location")),
        key_password=_text(librdkafka.get("ssl.key.password")),
        check_hostname=identification.lower() == "https",
        verify_certificate=_flag(librdkafka.get("enable.ssl.certificate.verification"), True),
    )


def ssl_context(security: RollupSecurity) -> ssl.SSLContext:
    """The TLS context for ``security``: its CA (else the system's), its client certificate and
    key if any, and the broker's name checked unless endpoint identification is off."""
    ca = security.ca_file
    try:
        if ca is not None and Path(ca).is_dir():
            context = ssl.create_default_context(capath=ca)
        elif ca is not None and ca != "probe":  # librdkafka's "probe": the system's CAs
            context = ssl.create_default_context(cafile=ca)
        else:
            context = ssl.create_default_context()
        if security.cert_file is not None:
            context.load_cert_chain(
                security.cert_file, security.key_file, password=security.key_password
            )
    except (OSError, ssl.SSLError) as exc:
        raise ConfigurationError(
            f"the analytics rollup cannot load its TLS files (CA {ca}, certificate "
            f"{security.cert_file}, key {security.key_file}): {exc}"
        ) from exc
    context.check_hostname = security.check_hostname and security.verify_certificate
    if not security.verify_certificate:
        context.verify_mode = ssl.CERT_NONE
    return context


def broker_credentials(security: RollupSecurity) -> CredentialsT | None:
    """faust's ``broker_credentials`` for ``security`` (None: PLAINTEXT, no login)."""
    context = ssl_context(security) if security.uses_tls else None
    if security.mechanism is not None:
        return faust.SASLCredentials(
            username=security.username,
            password=security.password,
            mechanism=security.mechanism,
            ssl_context=context,
        )
    if context is not None:
        return faust.SSLCredentials(context)
    return None


@dataclass(frozen=True, slots=True)
class RollupConfig:
    """What the rollup needs, built from the settings by the router (router.cli.analytics_commands)."""

    app_id: str
    bootstrap: str  # host:port[,host:port]
    points_topic: str
    partitions: int  # of the points topic; the app's own topics get as many (co-partitioning)
    replication_factor: int
    window_s: int
    window_retention_s: int
    guarantee: str  # "exactly_once" | "at_least_once"
    host: str
    port: int
    datadir: str
    session_timeout_s: float  # how soon a dead worker's partitions go to another
    producer_buffer: int = 100  # table changes queued for the producer before reading waits
    security: RollupSecurity = RollupSecurity()  # how it logs in (rollup_security)

    @property
    def broker(self) -> str:
        # aiokafka; faust's confluent driver cannot run against our broker (module docstring).
        return ";".join(f"kafka://{b.strip()}" for b in self.bootstrap.split(","))


def metric_shard(metric: str, partition: int) -> str:
    """``by_metric``'s key: a metric's count from one points partition."""
    return f"{metric}@{partition}"


def _windows(data: Mapping[Any, Any], key: str, since: float) -> list[tuple[float, float, Any]]:
    """The windows of ``key`` starting at or after ``since``, oldest first."""
    found = [
        (rng[0], rng[1], value)
        for (k, rng), value in list(data.items())
        if k == key and rng[0] >= since
    ]
    return sorted(found, key=lambda w: w[0])


def _since(request: Request, window_s: int) -> float:
    raw = request.query.get("since", "0")
    try:
        since = float(raw)
    except ValueError as exc:
        raise PointError(f"since must be seconds since the epoch, got {raw!r}") from exc
    return since // window_s * window_s  # the window holding ``since`` counts too


def internal_topics(app: faust.App) -> list[TopicSpec]:
    """The topics faust creates for ``app`` — each table's changelog and the leader topic — with
    the partitions, replication and configuration faust would give them
    (``faust.topics.Topic.declare``).

    They are created, and awaited until served, before the worker starts: faust creates them
    itself just before its consumer joins the group, and a topic created that late can be missing
    from the consumer's metadata at the join. The assignment then lacks the changelog partitions
    and every fold fails with ``PartitionsMismatch`` ("the changelog topic has 0 partitions")
    until the consumer's metadata next refreshes (five minutes): seen on a loaded machine as a
    worker that owned both points partitions and counted nothing."""
    conf = app.conf
    topics: list[Any] = [table.changelog_topic for table in app.tables.values()]
    if not conf.topic_disable_leader:
        # faust.assignor.leader_assignor.LeaderAssignor._leader_topic
        topics.append(app.topic(f"{conf.id}-__assignor-__leader", partitions=1, internal=True))
    specs = []
    for topic in topics:
        config: dict[str, str] = {}
        policy = [
            flag for flag, on in (("compact", topic.compacting), ("delete", topic.deleting)) if on
        ]
        if policy:
            config["cleanup.policy"] = ",".join(policy)
        if topic.retention:
            config["retention.ms"] = str(int(want_seconds(topic.retention) * 1000))
        config.update({k: str(v) for k, v in (topic.config or {}).items()})
        specs.append(
            TopicSpec(
                name=topic.get_topic_name(),
                partitions=topic.partitions or conf.topic_partitions,
                replication_factor=topic.replicas or conf.topic_replication_factor,
                config=config,
                kind="internal",
            )
        )
    return specs


@dataclass(frozen=True, slots=True)
class ReadThrough:
    """How far the consumer has read a partition: the offset of the last record it handed over
    (``last``) and its position after the fetches since (``position``). Between the two lie no
    records a reader is given (transaction markers, aborted records), only what a fetch passed
    over without handing it out."""

    last: int
    position: int


class _ConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
    """faust's aiokafka consumer, but a rebalance's recovery asks the broker where each changelog
    ends, and each fetch notes how far it read each partition (:class:`ReadThrough`).

    Under ``exactly_once`` faust takes a partition's end from the last fetch response for it, and
    right after an assignment there may have been none: recovery then took every changelog to be
    empty, restored nothing, and the worker counted on from the committed offsets (measured: a
    restarted worker showed 0 of 8,000 points in 2 of 14 runs; its next commits would have
    written those partial counts over the committed ones). ``end_offsets`` asks the broker at the
    consumer's isolation level, ``read_committed``: the last stable offset."""

    async def _highwaters(self, partitions: list[TP]) -> Mapping[TP, int]:
        consumer = self._ensure_consumer()
        return cast(Mapping[TP, int], await consumer.end_offsets(partitions))

    async def _fetch_records(
        self,
        consumer: Any,
        active_partitions: set[TP],
        timeout: float | None = None,
        max_records: int | None = None,
    ) -> Any:
        records = await super()._fetch_records(
            consumer, active_partitions, timeout=timeout, max_records=max_records
        )
        self._note_read_through(consumer, records)
        return records

    def _note_read_through(self, consumer: Any, records: Mapping[Any, list[Any]]) -> None:
        """Note each partition's :class:`ReadThrough` once a fetch returned: in this thread,
        nothing moves a position between aiokafka handing records over and this.

        aiokafka steps a partition's position over the markers and aborted records that follow
        the records it hands over, in the same fetch or in a later one that hands nothing over
        (faust asks for at most ``broker_max_poll_records`` records at a time, so the marker
        ending a transaction of that many comes alone). A seek moves it too, to a committed
        offset: behind the last record, the note says nothing to commit; ahead of it, what lies
        between is committed already."""
        subscription = consumer._subscription.subscription  # aiokafka's SubscriptionState
        assignment = subscription.assignment if subscription is not None else None
        if assignment is None:
            return
        through = cast(_Consumer, self.consumer).read_through_notes
        for atp in assignment.tps:
            state = assignment.state_value(atp)
            if state is None or not state.has_valid_position:
                continue
            tp = TP(atp.topic, atp.partition)
            handed = records.get(atp)
            if handed:
                through[tp] = ReadThrough(handed[-1].offset, state.position)
            elif (known := through.get(tp)) is not None and known.position != state.position:
                through[tp] = ReadThrough(known.last, state.position)


class _Consumer(faust_aiokafka.Consumer):
    """faust's aiokafka consumer, committing a partition read through to its position.

    A ``read_committed`` reader is never handed the marker that ends a transaction, so the
    offset after the last record folded is the marker's, one short of the log end: Kafka's
    tools, ``rhumbatron fleet status`` and a lag-based scaler would read lag 1 on every
    partition of a caught-up rollup. Once the last record the consumer handed over of a
    partition is folded (``folded``, kept by the app), nothing before its position waits to be
    folded, and the position is what a commit carries, at faust's next commit interval even
    when no new point was acknowledged."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Written by the consumer thread, read here; each value is replaced whole.
        self.read_through_notes: dict[TP, ReadThrough] = {}
        # The offset of each points partition's latest point folded (set by the app).
        self.folded: Mapping[TP, int] = {}

    def _new_consumer_thread(self) -> faust_aiokafka.AIOKafkaConsumerThread:
        return _ConsumerThread(self, loop=self.loop, beacon=self.beacon)

    def read_through(self, tp: TP) -> int | None:
        """``tp``'s position when it is past the offset after the last point folded and every
        record handed over before it is folded; else None."""
        last = self.folded.get(tp)
        note = self.read_through_notes.get(tp)
        if last is None or note is None or note.last != last or note.position <= last + 1:
            return None
        return note.position

    def commit_offset(self, tp: TP) -> int:
        """The offset a commit of ``tp`` carries: its read-through position, else the one after
        its last point folded (``tp`` must have one)."""
        through = self.read_through(tp)
        return through if through is not None else self.folded[tp] + 1

    def _filter_committable_offsets(self, tps: Iterable[TP]) -> dict[TP, int]:
        offsets = super()._filter_committable_offsets(tps := list(tps))
        for tp in tps:
            through = self.read_through(tp)
            if through is not None and self._should_commit(tp, through):
                offsets[tp] = max(offsets.get(tp, through), through)
        return offsets


class _Transport(faust_aiokafka.Transport):
    Consumer = _Consumer


def build_app(config: RollupConfig) -> faust.App:
    """The faust app with its topics, tables, agents and web views (not started)."""
    app = faust.App(
        config.app_id,
        broker=config.broker,
        store="memory://",
        datadir=config.datadir,
        autodiscover=False,
        processing_guarantee=config.guarantee,
        consumer_auto_offset_reset="earliest",
        topic_partitions=config.partitions,
        topic_replication_factor=config.replication_factor,
        web_host=config.host,
        web_port=config.port,
        web_bind=config.host,
        # Faust's own views would serve a table's values by key (/table) and the workers'
        # addresses and partitions (/router); the rollup's views serve counts only, and only
        # those are wanted on the port.
        web_tables_enabled=False,
        web_router_enabled=False,
        broker_session_timeout=config.session_timeout_s,
        broker_credentials=broker_credentials(config.security),
    )
    app.transport = _Transport(app.conf.broker_consumer, app)
    points = app.topic(
        config.points_topic,
        key_type=bytes,
        value_type=bytes,
        key_serializer="raw",
        value_serializer="raw",
    )
    expires = timedelta(seconds=config.window_retention_s)
    # faust's WindowWrapperT interface lacks relative_to(); the WindowWrapper it returns has it.
    by_project = cast(
        WindowWrapper,
        app.Table("by_project", default=dict, partitions=config.partitions).tumbling(
            config.window_s, expires=expires
        ),
    ).relative_to(_event_time)
    by_metric = cast(
        WindowWrapper,
        app.Table("by_metric", default=int, partitions=config.partitions).tumbling(
            config.window_s, expires=expires
        ),
    ).relative_to(_event_time)
    invalid = app.Table("invalid", default=int, partitions=config.partitions)
    tables = (by_project.table, by_metric.table, invalid)
    last_offsets: dict[TP, int] = {}  # the offset of each partition's latest point folded
    committed: dict[TP, int] = {}  # the offsets this worker committed since the assignment
    sent: list[asyncio.Future[Any]] = []  # table changes since the last commit (keep_sent)
    folding = asyncio.Event()  # cleared while a commit is made (commit_what_was_sent)
    folding.set()

    def keep_sent(table: Any) -> None:
        """Keep the future of each change ``table`` sends to its changelog."""
        send = table.send_changelog

        def send_and_keep(*args: Any, **kwargs: Any) -> Any:
            future = send(*args, **kwargs)
            sent.append(future)
            return future

        table.send_changelog = send_and_keep

    for table in tables:
        keep_sent(table)

    async def all_sent(stage: str) -> None:
        """Wait until every table change kept in ``sent`` is written to its changelog partition
        (in the open transaction of its points partition); raise naming what failed."""
        if not sent:
            return
        _, waiting = await asyncio.wait(list(sent), timeout=config.session_timeout_s)
        if waiting:
            raise ChangelogNotSent(
                f"{len(waiting)} of {len(sent)} table changes were not written to the changelog "
                f"within {config.session_timeout_s:g} s ({stage}); the rollup stops rather than "
                "commit offsets past them, and a restart reads them again"
            )
        failed = [f.exception() for f in sent if f.exception() is not None]
        sent.clear()
        if failed:
            raise ChangelogNotSent(
                f"{len(failed)} table changes could not be written to the changelog ({stage}): "
                f"{failed[0]!r}"
            )

    faust_commit: list[Any] = []  # faust's own TransactionManager.commit, once replaced

    async def commit_what_was_sent(
        offsets: Mapping[TP, int], start_new_transaction: bool = True
    ) -> bool:
        """Commit, with each partition's offset, exactly the table changes of the points before
        it.

        faust queues a table change in its producer buffer and sends it from there, and commits
        a transaction without draining that buffer: the changes of points whose offsets it
        commits could still be queued, to go out in the next transaction, and a SIGKILL or a
        rebalance before that one committed lost them (measured: 14 of 13,334 points short
        after three SIGKILLs mid-stream). Here no point is folded while a commit is made, every
        change sent so far is written first, and each partition's offset is the one after its
        last point folded, or past the markers after it once it is read through
        (``_Consumer.read_through``), whatever faust counted as acknowledged. An offset is never
        committed below one this worker committed since the assignment: a read-through commit
        can be ahead of the offset after the last point folded."""
        folding.clear()
        try:
            await all_sent("before a commit")
            consumer = cast(_Consumer, app.consumer)
            exact = {
                tp: offset
                for tp in offsets
                if tp in last_offsets
                and (offset := consumer.commit_offset(tp)) > committed.get(tp, -1)
            }
            if not exact:
                return False
            done: bool = await faust_commit[0](exact, start_new_transaction=start_new_transaction)
            if done:
                committed.update(exact)
            return done
        finally:
            folding.set()

    @app.on_partitions_assigned.connect  # type: ignore[arg-type]  # (mode's stub wants a union)
    async def guard_commits(sender: Any, *args: Any, signal: Any, **kwargs: Any) -> None:
        """Have every commit go through :func:`commit_what_was_sent` (installed once), and the
        consumer see the points folded (``_Consumer.read_through``)."""
        del sender, args, signal, kwargs
        cast(_Consumer, app.consumer).folded = last_offsets
        # faust.transport.producer.ProducerBuffer: past this many queued changes, it holds back
        # the next point, sends changes and logs "producer buffer full" (docs/analytics.md).
        cast(Any, app.producer).buffer.max_messages = config.producer_buffer
        if not faust_commit:
            manager = cast(Any, app.consumer).transactions  # faust's TransactionManager
            faust_commit.append(manager.commit)
            manager.commit = commit_what_was_sent

    @app.on_partitions_revoked.connect  # type: ignore[arg-type]  # (mode's stub wants a union)
    async def forget_uncommitted(sender: Any, *args: Any, signal: Any, **kwargs: Any) -> None:
        """Abort the open transactions, drop the tables, and have recovery read the changelogs
        from their start: after a rebalance the worker holds exactly what was committed.

        A worker that loses its group membership (a stall longer than the session timeout)
        cannot commit its open transaction. faust kept it open when the same partitions came
        back (it stops a partition's producer only when the partition goes to another worker),
        and kept the folds in memory too: every point of the lost transaction was read again
        from the committed offsets and counted twice (measured: 2,000 for 1,000 points, for
        good). Dropping only the memory is not enough: the next commit would carry the open
        transaction's changelog records, written before the stall, with the offsets of the
        second reading, and a restart would count some points twice. Aborted, those records are
        never read by recovery (read_committed).
        faust revokes every partition at a rebalance (eager protocol), so this runs at each one;
        faust's own flush of its producer buffer can return with changes still queued
        (it gives up after 0.1 s without a send), so the queue is emptied here."""
        del sender, args, signal, kwargs
        producer = cast(Any, app.producer)
        # Changes still queued in faust's buffer belong to the transaction aborted here: they
        # are never sent (sent later, they would land in the next transaction). The one being
        # sent, and those sent, are awaited first, so that the abort takes them.
        queued = producer.buffer.pending  # faust.transport.producer.ProducerBuffer
        dropped = set()
        while not queued.empty():
            dropped.add(id(queued.get_nowait()))
        sent[:] = [future for future in sent if id(future) not in dropped]
        try:
            await all_sent("before an abort")
        except ChangelogNotSent:
            log.exception("aborting the open transactions without some table changes")
            sent.clear()
        for transactional_id in list(getattr(producer, "_transaction_producers", {})):
            await producer.abort_transaction(transactional_id)
        last_offsets.clear()
        committed.clear()
        recovery = cast(Any, app.tables).recovery  # faust.tables.recovery.Recovery
        for table in tables:
            table.data.clear()
            for partition in range(config.partitions):
                recovery.revoke(TP(table.changelog_topic.get_topic_name(), partition))

    @app.agent(points, name="rollup")
    async def roll_points(stream: StreamT[bytes]) -> None:
        keep_delivered(stream)
        async for event in stream.events():
            if not folding.is_set():
                await folding.wait()  # a commit is being made
            # From here to the point's acknowledgement (by faust, on the next iteration) nothing
            # awaits: no commit can fall between a fold and its offset's acknowledgement.
            if already_folded(event.message.tp, event.message.offset):
                continue
            note_gap(event.message.tp, event.message.offset)
            with point_span(event, config.app_id) as span:
                fold(event, span)

    def keep_delivered(stream: StreamT[bytes]) -> None:
        """Keep faust from emptying the agent's queue whenever it resumes its flow.

        faust empties every stream queue when it resumes its flow, and it resumes it at the end
        of each recovery, after it has sought the points partitions to the committed offsets:
        points delivered since that seek and not yet taken by the agent were dropped, while
        faust's record of the last offset it read had moved past them, so they were never read
        again and the next commit went past them. Seen once as one point of 8,000 missing after
        a restart; with the agent slowed down, 82 at one restart (``test_rollup_kafka.py``). A point
        left in the queue from before a rebalance is still not folded: faust skips a message of
        an earlier generation, and one taken while its flow is suspended."""
        queue = cast(Any, stream.channel).queue  # mode's FlowControlQueue
        cast(Any, app.flow_control)._queues.discard(queue)  # those emptied on resume

    def already_folded(tp: TP, offset: int) -> bool:
        """Whether the point at ``offset`` was folded since the partition was assigned.

        After a recovery faust resumes the points partitions, with its flow running, before it
        seeks them to the committed offsets; a point fetched in between is folded, and fetched
        again after the seek, from the same committed offset, it passes faust's own check (which
        lets the offset last read through again). Seen as one point counted twice after a
        restart, with a hole in faust's acknowledged offsets just past the committed one, as a
        second delivery leaves. Both readings start at the group's committed offset, so a point
        read again is one at or before the last one folded."""
        last = last_offsets.get(tp)
        if last is None or offset > last:
            return False
        log.info(
            "point %s[%d]@%d read again after the point at %d was folded; not counted twice",
            tp.topic,
            tp.partition,
            offset,
            last,
        )
        return True

    def note_gap(tp: TP, offset: int) -> None:
        """Make faust's record of the offsets of ``tp`` it will never deliver before ``offset``
        exact.

        A ``read_committed`` reader is never given a transaction's commit or abort marker, nor
        an aborted record, and the points topic has a marker after each of the projector's
        transactions. faust commits a partition's offset up to the first offset it was neither
        given nor told is a gap; the gap it notes takes in the next delivered offset too (faust
        0.15 adds ``[last read + 1, offset + 1)``), which then counts twice among the acked
        offsets and ends each commit there: every 2.8 s, one commit got past one marker.
        Measured: 8,000 points in 16 transactions were counted in 6 s, their offsets were still
        being committed 40 s later while the changelog holding their counts already was, and a
        restart counted 998 of them again."""
        consumer = cast(Any, app.consumer)  # faust.transport.consumer.Consumer
        previous = last_offsets.get(tp)
        last_offsets[tp] = offset
        if previous is None or offset == previous + 1:
            return
        gaps = consumer._gap[tp]  # an IntervalTree of offsets never delivered
        committed = consumer._committed_offset.get(tp)  # the next offset to commit from
        first = previous + 1 if committed is None else max(previous + 1, committed)
        if first < offset:
            gaps.addi(first, offset)
        gaps.chop(offset, offset + 1)
        gaps.merge_overlaps()

    def fold(event: EventT[Any], span: trace.Span | None) -> None:
        partition = event.message.partition
        try:
            point = parse_point(event.value)
        except PointError as exc:
            invalid[str(partition)] += 1
            log.error(
                "invalid point at %s[%d]@%d, not counted: %s",
                event.message.topic,
                partition,
                event.message.offset,
                exc,
            )
            if span is not None:
                span.set_attribute(t.OUTCOME, INVALID)
                span.record_exception(exc)
                span.set_status(StatusCode.ERROR, f"invalid point, not counted: {exc}")
            return
        current = dict(by_project[point.project_id].value())
        current[point.metric] = current.get(point.metric, 0) + 1
        by_project[point.project_id] = current
        by_metric[metric_shard(point.metric, partition)] += 1
        if span is not None:
            span.set_attributes(
                {t.OUTCOME: COUNTED, METRIC: point.metric, t.PROJECT: point.project_id}
            )

    def local_partitions() -> list[int]:
        try:
            assigned = app.consumer.assignment()
        except ConsumerNotStarted as exc:
            # The web view starts before the consumer thread: answer "not ready" (503), which
            # `rhumbatron analytics` reports as such, rather than an internal error.
            raise ServiceUnavailable("the rollup's consumer is still starting") from exc
        if app.rebalancing:
            # From the revoke until its tables are recovered, they hold only part of what was
            # committed: no answer rather than a low one.
            raise ServiceUnavailable("the rollup is rebalancing (recovering its tables)")
        return sorted(tp.partition for tp in assigned if tp.topic == config.points_topic)

    @app.page("/analytics/metric/{metric}/")
    class MetricView(View):
        async def get(self, request: Request, metric: str) -> Response:
            if metric not in METRIC_NAMES:
                return self.json(
                    {"error": f"unknown metric {metric!r}", "known": sorted(METRIC_NAMES)},
                    status=404,
                )
            try:
                since = _since(request, config.window_s)
            except PointError as exc:
                return self.json({"error": str(exc)}, status=400)
            partitions = local_partitions()
            counts: dict[float, int] = {}
            for partition in partitions:
                shard = metric_shard(metric, partition)
                for start, _, n in _windows(by_metric.table.data, shard, since):
                    counts[start] = counts.get(start, 0) + n
            windows = [
                {"start": format_epoch(s), "end": format_epoch(s + config.window_s), "count": n}
                for s, n in sorted(counts.items())
            ]
            return self.json(
                {
                    "metric": metric,
                    "windowSeconds": config.window_s,
                    "since": format_epoch(since),
                    "partitions": partitions,
                    "partitionsTotal": config.partitions,
                    "windows": windows,
                    "total": sum(w["count"] for w in windows),
                }
            )

    @app.page("/analytics/project/{project}/")
    class ProjectView(View):
        @app.topic_route(topic=points, match_info="project")  # type: ignore[arg-type]
        async def get(self, request: Request, project: str) -> Response:
            try:
                since = _since(request, config.window_s)
            except PointError as exc:
                return self.json({"error": str(exc)}, status=400)
            windows = [
                {
                    "start": format_epoch(s),
                    "end": format_epoch(s + config.window_s),
                    "counts": counts,
                }
                for s, _, counts in _windows(by_project.table.data, project, since)
            ]
            return self.json(
                {
                    "project": project,
                    "windowSeconds": config.window_s,
                    "since": format_epoch(since),
                    "windows": windows,
                }
            )

    @app.page("/analytics/status/")
    class StatusView(View):
        async def get(self, request: Request) -> Response:
            return self.json(
                {
                    "app": config.app_id,
                    "pointsTopic": config.points_topic,
                    "windowSeconds": config.window_s,
                    "windowRetentionSeconds": config.window_retention_s,
                    "guarantee": config.guarantee,
                    "partitions": local_partitions(),
                    "partitionsTotal": config.partitions,
                    "invalidPoints": {k: v for k, v in invalid.items()},
                    # every point folded so far by this worker (its partitions, all windows)
                    "pointsCounted": sum(by_metric.table.data.values()),
                    "metrics": sorted(METRIC_NAMES),
                }
            )

    return app


def run_worker(app: faust.App, *, loglevel: str = "warning") -> None:
    """Run the rollup until SIGTERM or SIGINT (faust's worker handles both)."""
    worker = faust.Worker(app, loglevel=loglevel, quiet=True, redirect_stdouts=False)
    try:
        worker.execute_from_commandline()
    except SystemExit as exc:
        if exc.code not in (0, None):
            raise
