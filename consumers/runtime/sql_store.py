"""The Store in PostgreSQL, for SQL-effect processors: the subscription's owner epoch, both
cursors, its fold and its claims are rows of the database its statements write (the tables:
``sql_database``), so one transaction commits a batch's statements with its claims, its fold and
its cursor. Claims live ``claim_ttl_ms`` after they were written, as the Redis claims do: an
expired one is ignored, and deleted at a commit once an hour a partition.

A call to :meth:`SqlStore.commit_many` (every partition of a poll) is one transaction, each
partition's commit under a SAVEPOINT of its own, so a refused one takes back only its own:

1. The cursor UPDATE, ``WHERE epoch = <mine>`` and the cursor and fold generation are where the
   caller read them. A zombie's (or a moved cursor's) matches no row: it is rolled back to its
   savepoint and refused (Fenced, CursorMoved) having written nothing, and the caller drops the
   partition (or reloads it). The row stays locked to the end of the transaction, so nothing
   moves the cursor in between. The claim check rides in the same round trip.
2. The events' statements in offset order, then the claims, the fold, the failure counts it
   passed and the excluded offsets: one round trip (psycopg's pipeline mode; a statement run
   often is prepared, which halves the server's work on a small upsert).
3. Should a statement fail with an error of its event's own, the call starts again from BEGIN,
   on a new connection (after a failed pipeline psycopg may take for prepared a statement the
   server never saw), and that partition's statements run one event at a time, each under a
   SAVEPOINT of its own: an event whose statements fail is rolled back to its savepoint and the
   later events of its project are not run; the others are. The partition's commit is then
   rolled back whole and refused with StatementsFailed, naming the failed events; the runner
   processes the batch again with those failed, their projects held back behind them, and
   commits the other events' statements with the rest.

An outage of the database (``sql_database``: SQLSTATE classes 08 and 40, the server's own
trouble, a lost connection) rolls the whole call back and raises Unreachable or ServerRefused;
the runner reads those partitions again after a backoff, counting no failure. Any other error of an event's statements
(22 data, 23 integrity constraint, 42 syntax or access, 57014 a statement cancelled by its
timeout, P0 a RAISE of its own …) is that event's failure, counted and dead-lettered by the
subscription's policy. An error of the store's own statements is no event's: it raises.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence

import orjson
import psycopg

from consumers.runtime.sql_database import Cursor, Database, Query, pipelined, provision_sql_store
from consumers.runtime.store import (
    NO_SLOTS,
    Commit,
    Decisions,
    EventStatements,
    Slots,
    decode_pending,
    encode_pending,
)
from consumers.runtime.types import JSON, TP, OutRecord, Progress
from streams import failpoints
from streams.clock import Clock
from streams.errors import (
    ClaimsFound,
    ConfigurationError,
    CursorMoved,
    Fenced,
    PendingEffects,
    PipelineBroken,
    StatementsFailed,
)

__all__ = ["SqlStore", "provision_sql_store"]

log = logging.getLogger("rhumbatron.runtime.sql")

# Expired claims are ignored by every lookup; a partition's are deleted at most this often, only
# to keep the table from growing.
CLAIM_SWEEP_S = 3600.0
_UPDATE_CURSOR = (
    "UPDATE rhumbatron_partitions SET acked_through = %s, cursor_revision = %s, "
    "reduced_through = %s, reducer_version = %s, fold_generation = %s, progress = %s::json"
)
_CURRENT = (
    "SELECT epoch, acked_through, cursor_revision, fold_generation, pending IS NOT NULL "
    "FROM rhumbatron_partitions WHERE id = %s"
)


class SqlStore:
    """The Store contract on PostgreSQL (see the module docstring), on one connection to the
    subscription's database (``sql_database.Database``)."""

    def __init__(
        self,
        url: str,
        *,
        env: str,
        slug: str,
        clock: Clock,
        claim_ttl_ms: int,
        failure_ttl_s: int = 7 * 86_400,
        connect_timeout_s: float = 10.0,
        failpoint: Callable[[str], None] = failpoints.hit,
    ) -> None:
        self.env = env
        self.slug = slug
        self.clock = clock
        self.claim_ttl_ms = claim_ttl_ms
        self.failure_ttl_s = failure_ttl_s
        # Hit inside a commit's transaction, its statements run, right before COMMIT.
        self.failpoint = failpoint
        self.db = Database(url, slug=slug, connect_timeout_s=connect_timeout_s)
        self._ids: dict[TP, int] = {}
        self._swept: dict[int, float] = {}  # partition id -> when its expired claims went

    def check(self) -> None:
        """Refuse, saying what to run, a database without the store's tables (or one this role
        may not read): before a subscription starts, not at its first partition."""
        absent = self.db.missing_tables()
        if absent:
            raise ConfigurationError(
                f"{self.slug}'s database ({self.db.where}, [subscriptions.{self.slug}] database) "
                f"lacks the SQL store's tables ({', '.join(absent)}): run `rhumbatron provision`"
            )

    def close(self) -> None:
        self.db.close()

    # -- partitions ------------------------------------------------------------------------------
    def _key(self, tp: TP) -> tuple[str, str, str, int]:
        return (self.env, self.slug, tp.topic, tp.partition)

    def _id(self, cursor: Cursor, tp: TP, *, create: bool) -> int | None:
        """The partition's row id (its row made when ``create``; else None when it has none)."""
        known = self._ids.get(tp)
        if known is not None:
            return known
        find = (
            "SELECT id FROM rhumbatron_partitions "
            "WHERE env = %s AND slug = %s AND topic = %s AND partition = %s"
        )
        row = cursor.execute(find, self._key(tp)).fetchone()
        if row is None and create:
            cursor.execute(
                "INSERT INTO rhumbatron_partitions (env, slug, topic, partition) "
                "VALUES (%s, %s, %s, %s) ON CONFLICT (env, slug, topic, partition) DO NOTHING",
                self._key(tp),
            )
            row = cursor.execute(find, self._key(tp)).fetchone()
        if row is None:
            return None
        self._ids[tp] = int(row[0])
        return self._ids[tp]

    def _now_ms(self) -> int:
        return int(self.clock.now().timestamp() * 1000)

    def _refusal(
        self,
        cursor: Cursor,
        tp: TP,
        pid: int,
        epoch: int | None,
        expected: tuple[int, int, int | None, bool],
    ) -> Exception:
        """Why a cursor UPDATE matched no row, read after its savepoint was rolled back.
        ``expected``: the cursor and fold generation the caller read, and whether it brought
        pending effects."""
        row = cursor.execute(_CURRENT, (pid,)).fetchone()
        current, acked, revision, generation, pending = row or (0, -1, 0, 0, False)
        if epoch is not None and current != epoch:
            return Fenced(tp, epoch, current)
        want_acked, want_revision, want_generation, want_free = expected
        if (acked, revision) != (want_acked, want_revision) or (
            want_generation is not None and generation != want_generation
        ):
            return CursorMoved(tp, (want_acked, want_revision), (acked, revision))
        if want_free and pending:
            return PendingEffects(tp)
        return CursorMoved(tp, (want_acked, want_revision), (acked, revision))

    # -- Store: ownership and reads --------------------------------------------------------------
    def acquire(self, tp: TP) -> int:
        def bump(cursor: Cursor) -> int:
            row = cursor.execute(
                "INSERT INTO rhumbatron_partitions (env, slug, topic, partition, epoch) "
                "VALUES (%s, %s, %s, %s, 1) ON CONFLICT (env, slug, topic, partition) "
                "DO UPDATE SET epoch = rhumbatron_partitions.epoch + 1 RETURNING id, epoch",
                self._key(tp),
            ).fetchone()
            assert row is not None
            self._ids[tp] = int(row[0])
            return int(row[1])

        return self.db.write(f"taking {tp}", bump)

    def epoch(self, tp: TP) -> int:
        def read(cursor: Cursor) -> int:
            row = cursor.execute(
                "SELECT epoch FROM rhumbatron_partitions "
                "WHERE env = %s AND slug = %s AND topic = %s AND partition = %s",
                self._key(tp),
            ).fetchone()
            return int(row[0]) if row else 0

        return self.db.read(f"reading {tp}'s owner epoch", read)

    def load(self, tp: TP) -> Progress:
        def read(cursor: Cursor) -> Progress:
            row = cursor.execute(
                "SELECT progress::text FROM rhumbatron_partitions "
                "WHERE env = %s AND slug = %s AND topic = %s AND partition = %s",
                self._key(tp),
            ).fetchone()
            return Progress.from_fields(orjson.loads(row[0]) if row else {})

        return self.db.read(f"reading {tp}'s cursor", read)

    # Claims here stay by event id, rows the store expires with the stream's retention: the
    # slots of outbox events (``slots``) are for the Redis layout, whose memory they bound.
    def claimed(
        self,
        tp: TP,
        revision: int,
        event_ids: Sequence[str],
        *,
        dead: bool = False,
        slots: Slots = NO_SLOTS,
    ) -> set[str]:
        found = self.decisions(tp, revision, event_ids)
        return found.dead if dead else found.applied

    def decisions(
        self, tp: TP, revision: int, event_ids: Sequence[str], slots: Slots = NO_SLOTS
    ) -> Decisions:
        return self.decisions_many([(tp, revision, event_ids)])[0]

    def decisions_many(
        self, asks: Sequence[tuple[TP, int, Sequence[str]]], slots: Slots = NO_SLOTS
    ) -> list[Decisions]:
        out = [Decisions(set(), set(), set()) for _ in asks]
        if not any(ids for _, _, ids in asks):
            return out

        def read(cursor: Cursor) -> None:
            ns: list[int] = []
            pids: list[int] = []
            revisions: list[int] = []
            event_ids: list[str] = []
            for n, (tp, revision, ids) in enumerate(asks):
                pid = self._id(cursor, tp, create=False) if ids else None
                if pid is None:
                    continue
                for event_id in ids:
                    ns.append(n)
                    pids.append(pid)
                    revisions.append(revision)
                    event_ids.append(event_id)
            if not ns:
                return
            rows = cursor.execute(
                "SELECT a.n, c.event_id, c.dead FROM unnest(%s::int[], %s::bigint[], "
                "%s::bigint[], %s::text[]) AS a(n, pid, revision, event_id) "
                "JOIN rhumbatron_claims c ON c.partition_id = a.pid AND c.event_id = a.event_id "
                "AND c.revision = a.revision WHERE c.expires_ms > %s",
                (ns, pids, revisions, event_ids, self._now_ms()),
            ).fetchall()
            for n, event_id, dead in rows:
                out[n][1 if dead else 0].add(event_id)

        self.db.read("looking up claims", read)
        return out

    def states(self, tp: TP, projects: Iterable[str]) -> dict[str, JSON | None]:
        wanted = list(projects)
        if not wanted:
            return {}

        def read(cursor: Cursor) -> dict[str, JSON | None]:
            found: dict[str, JSON | None] = dict.fromkeys(wanted)
            pid = self._id(cursor, tp, create=False)
            if pid is None:
                return found
            rows = cursor.execute(
                "SELECT project, state::text FROM rhumbatron_folds "
                "WHERE partition_id = %s AND project = ANY(%s::text[])",
                (pid, wanted),
            ).fetchall()
            found.update((project, orjson.loads(state)) for project, state in rows)
            return found

        return self.db.read(f"reading {tp}'s folds", read)

    def all_states(self, tp: TP) -> dict[str, JSON]:
        def read(cursor: Cursor) -> dict[str, JSON]:
            pid = self._id(cursor, tp, create=False)
            if pid is None:
                return {}
            rows = cursor.execute(
                "SELECT project, state::text FROM rhumbatron_folds WHERE partition_id = %s",
                (pid,),
            ).fetchall()
            return {project: orjson.loads(state) for project, state in rows}

        return self.db.read(f"reading {tp}'s folds", read)

    def excluded(self, tp: TP) -> set[int]:
        def read(cursor: Cursor) -> set[int]:
            pid = self._id(cursor, tp, create=False)
            if pid is None:
                return set()
            rows = cursor.execute(
                'SELECT "offset" FROM rhumbatron_excluded WHERE partition_id = %s', (pid,)
            ).fetchall()
            return {int(row[0]) for row in rows}

        return self.db.read(f"reading {tp}'s excluded offsets", read)

    def pending(self, tp: TP) -> list[OutRecord]:
        def read(cursor: Cursor) -> bytes:
            row = cursor.execute(
                "SELECT pending FROM rhumbatron_partitions "
                "WHERE env = %s AND slug = %s AND topic = %s AND partition = %s",
                self._key(tp),
            ).fetchone()
            return bytes(row[0]) if row and row[0] is not None else b""

        return decode_pending(self.db.read(f"reading {tp}'s pending effects", read))

    def read(self, tp: TP, key: str) -> object:
        raise NotImplementedError(
            f"{self.slug} keeps its effects as rows of its own tables in {self.db.where}, not as "
            f"keys ({key!r} of {tp}): read them with SQL"
        )

    # -- Store: the commit -----------------------------------------------------------------------
    def commit(self, commit: Commit) -> None:
        refused = self.commit_many([commit])[0]
        if refused is not None:
            raise refused

    def commit_many(self, commits: Sequence[Commit]) -> list[Exception | None]:
        if not commits:
            return []
        with self.db.lock:
            # The commits whose statements run an event at a time (their batch met an error of
            # an event's statements): each time one does, the call starts again, on a new
            # connection, with one more of them.
            careful: set[int] = set()
            while True:
                cursor = self.db.cursor()
                try:
                    return self._transaction(cursor, commits, careful)
                except PipelineBroken as met:
                    self.db.abandon()
                    careful.add(met.index)
                except psycopg.Error as exc:
                    error = self.db.translated(exc, "committing a batch")
                    self.db.abandon()
                    raise error from exc
                except BaseException:
                    self.db.abandon()
                    raise

    def _transaction(
        self, cursor: Cursor, commits: Sequence[Commit], careful: set[int]
    ) -> list[Exception | None]:
        pids = [self._id(cursor, c.tp, create=True) for c in commits]
        now = self._now_ms()
        cursor.execute("BEGIN")
        refusals = []
        for n, (commit, pid) in enumerate(zip(commits, pids, strict=True)):
            assert pid is not None
            refusals.append(self._commit_one(cursor, commit, pid, now, n, careful=n in careful))
        self.failpoint("sql.before_commit")
        cursor.execute("COMMIT")
        return refusals

    def _commit_one(
        self, cursor: Cursor, commit: Commit, pid: int, now: int, n: int, *, careful: bool
    ) -> Exception | None:
        """One partition's commit inside the call's transaction, under a savepoint: None when it
        applied, else its refusal, with everything of it rolled back. Its statements go in one
        pipeline with the rest; one that fails raises PipelineBroken (the call starts again,
        this commit ``careful``: an event at a time, to tell which failed)."""
        tp, progress = commit.tp, commit.progress
        pending = encode_pending(commit.pending) if commit.pending is not None else None
        claims = list(dict.fromkeys(commit.claims))
        dead = list(dict.fromkeys(commit.dead_claims))
        if commit.looked:
            met = (
                "SELECT 1 FROM rhumbatron_claims WHERE partition_id = %s AND revision = %s "
                "AND expires_ms > %s AND ((NOT dead AND event_id = ANY(%s::text[])) "
                "OR (dead AND event_id = ANY(%s::text[])))"
            )
            met_params: tuple[object, ...] = (pid, progress.cursor_revision, now, claims, dead)
        else:
            # Not looked up before processing: a claim of any of its events, at any revision,
            # refuses it, and the caller looks up and processes again.
            met = (
                "SELECT 1 FROM rhumbatron_claims WHERE partition_id = %s AND expires_ms > %s "
                "AND event_id = ANY(%s::text[])"
            )
            met_params = (pid, now, [*claims, *dead, *commit.unclaimed])
        # The fence: the cursor moves only WHERE the epoch is the caller's (and the cursor and
        # fold generation are where it read them); the claim check sees the claims before it.
        update = (
            f"WITH moved AS ({_UPDATE_CURSOR}, pending = COALESCE(%s::bytea, pending) "
            "WHERE id = %s AND epoch = %s AND acked_through = %s AND cursor_revision = %s "
            "AND fold_generation = %s"
            + (" AND pending IS NULL" if pending is not None else "")
            + f" RETURNING 1) SELECT (SELECT count(*) FROM moved), EXISTS ({met})"
        )
        params = (
            *self._cursor_columns(progress),
            pending,
            pid,
            commit.epoch,
            commit.expected_acked,
            commit.expected_revision,
            progress.fold_generation,
            *met_params,
        )
        pipelined(cursor, [("SAVEPOINT rh_commit", None), (update, params)])
        row = cursor.fetchone()
        assert row is not None
        moved, claimed = row
        if not moved:
            pipelined(cursor, _TAKEN_BACK)
            expected = (
                commit.expected_acked,
                commit.expected_revision,
                progress.fold_generation,
                pending is not None,
            )
            return self._refusal(cursor, tp, pid, commit.epoch, expected)
        if claimed:
            pipelined(cursor, _TAKEN_BACK)
            if not commit.looked:
                return ClaimsFound(tp)
            # A claim appeared that this owner did not see when it read: its cursor moved.
            expected_cursor = (commit.expected_acked, commit.expected_revision)
            return CursorMoved(tp, expected_cursor, expected_cursor)
        books = self._bookkeeping(commit, pid, now)
        if careful:
            failures = self._one_by_one(cursor, commit.sql)
            if failures:
                pipelined(cursor, _TAKEN_BACK)
                log.info(
                    "%s: statements of %d events of %s failed; the batch goes again without them",
                    self.slug,
                    len(failures),
                    tp,
                )
                return StatementsFailed(tp, failures)
            # They all ran this time (what failed before was not an event's, or is no more).
            pipelined(cursor, [*books, ("RELEASE SAVEPOINT rh_commit", None)])
            return None
        try:
            pipelined(
                cursor,
                [
                    *(query for event in commit.sql for query in _queries(event)),
                    *books,
                    ("RELEASE SAVEPOINT rh_commit", None),
                ],
            )
        except psycopg.Error as exc:
            if self.db.is_outage(exc) or not commit.sql:
                raise
            raise PipelineBroken(n) from exc
        return None

    def _one_by_one(
        self, cursor: Cursor, events: Sequence[EventStatements]
    ) -> dict[str, BaseException]:
        """Each event's statements under a SAVEPOINT of its own, in order, a statement a round
        trip and none prepared (so an error leaves psycopg's prepared statements as they were):
        the events whose statements failed, rolled back to their savepoint; the later events of
        a failed one's project are not run. An outage raises."""
        failures: dict[str, BaseException] = {}
        held: set[str] = set()
        for event in events:
            if event.project_id in held or not event.statements:
                continue
            cursor.execute("SAVEPOINT rh_event", prepare=False)
            try:
                for query, params in _queries(event):
                    cursor.execute(query, params, prepare=False)
            except psycopg.Error as exc:
                if self.db.is_outage(exc):
                    raise
                cursor.execute("ROLLBACK TO SAVEPOINT rh_event", prepare=False)
                failures[event.event_id] = exc
                held.add(event.project_id)
            cursor.execute("RELEASE SAVEPOINT rh_event", prepare=False)
        return failures

    def _bookkeeping(self, commit: Commit, pid: int, now: int) -> list[Query]:
        """What a commit writes besides the cursor and the statements: claims, folds, failure
        counts passed, excluded offsets (and, once an hour, the partition's expired claims
        deleted)."""
        out: list[Query] = []
        claims = list(dict.fromkeys(commit.claims))
        dead = list(dict.fromkeys(commit.dead_claims))
        if claims or dead:
            out.append(self._claims(pid, commit.progress.cursor_revision, claims, dead, now))
        sets: dict[str, str] = {}
        deletes: list[str] = []
        for project, state in commit.states.items():
            if state is None:
                deletes.append(project)
            else:
                encoded = orjson.dumps(state)
                sets[project] = encoded.decode()
                commit.state_bytes[project] = len(encoded)
        if sets:
            out.append(_folds(pid, sets))
        if deletes:
            out.append(
                (
                    "DELETE FROM rhumbatron_folds WHERE partition_id = %s "
                    "AND project = ANY(%s::text[])",
                    (pid, deletes),
                )
            )
        if commit.cleared_failures:
            out.append(
                (
                    "DELETE FROM rhumbatron_failures WHERE partition_id = %s "
                    "AND batch_key = ANY(%s::text[])",
                    (pid, list(commit.cleared_failures)),
                )
            )
        out += _exclusions(pid, commit.excluded_add, commit.excluded_remove)
        monotonic = self.clock.monotonic()
        if monotonic - self._swept.get(pid, -CLAIM_SWEEP_S) >= CLAIM_SWEEP_S:
            self._swept[pid] = monotonic
            out.append(
                (
                    "DELETE FROM rhumbatron_claims WHERE partition_id = %s AND expires_ms <= %s",
                    (pid, now),
                )
            )
        return out

    def _claims(
        self, pid: int, revision: int, claims: Sequence[str], dead: Sequence[str], now: int
    ) -> Query:
        return (
            "INSERT INTO rhumbatron_claims (partition_id, event_id, revision, dead, expires_ms) "
            "SELECT %s, e, %s, d, %s FROM unnest(%s::text[], %s::bool[]) AS u(e, d) "
            "ON CONFLICT (partition_id, event_id, revision, dead) "
            "DO UPDATE SET expires_ms = EXCLUDED.expires_ms",
            (
                pid,
                revision,
                now + self.claim_ttl_ms,
                [*claims, *dead],
                [False] * len(claims) + [True] * len(dead),
            ),
        )

    @staticmethod
    def _cursor_columns(progress: Progress) -> tuple[object, ...]:
        return (
            progress.acked_through,
            progress.cursor_revision,
            progress.reduced_through,
            progress.reducer_version,
            progress.fold_generation,
            orjson.dumps(progress.as_fields()).decode(),
        )

    # -- Store: controls, pending effects, failures ----------------------------------------------
    def replace_fold(
        self,
        tp: TP,
        epoch: int | None,
        expected: tuple[int, int],
        progress: Progress,
        states: dict[str, JSON] | None,
        expected_generation: int | None = None,
        exclude: Sequence[int] = (),
        readmit: Sequence[int] = (),
        dead_claims: Sequence[str] = (),
        slots: Slots = NO_SLOTS,
    ) -> None:
        def swap(cursor: Cursor) -> None:
            pid = self._id(cursor, tp, create=True)
            assert pid is not None
            checks = ["id = %s", "acked_through = %s", "cursor_revision = %s"]
            values: list[object] = [pid, expected[0], expected[1]]
            if epoch is not None:
                checks.append("epoch = %s")
                values.append(epoch)
            if expected_generation is not None:
                checks.append("fold_generation = %s")
                values.append(expected_generation)
            update = f"{_UPDATE_CURSOR} WHERE {' AND '.join(checks)} RETURNING 1"
            pipelined(
                cursor, [("BEGIN", None), (update, (*self._cursor_columns(progress), *values))]
            )
            if cursor.fetchone() is None:
                cursor.execute("ROLLBACK")
                raise self._refusal(cursor, tp, pid, epoch, (*expected, expected_generation, False))
            writes: list[Query] = []
            if states is not None:
                writes.append(("DELETE FROM rhumbatron_folds WHERE partition_id = %s", (pid,)))
                if states:
                    writes.append(
                        _folds(pid, {p: orjson.dumps(s).decode() for p, s in states.items()})
                    )
            # Readmitted first, then excluded: an offset in both stays excluded.
            writes += _exclusions(pid, (), readmit)
            writes += _exclusions(pid, exclude, ())
            if dead_claims:
                ids = list(dict.fromkeys(dead_claims))
                writes.append(self._claims(pid, progress.cursor_revision, (), ids, self._now_ms()))
            pipelined(cursor, [*writes, ("COMMIT", None)])

        self.db.write(f"replacing {tp}'s fold", swap)

    def clear_pending(self, tp: TP, epoch: int) -> None:
        def clear(cursor: Cursor) -> None:
            pid = self._id(cursor, tp, create=True)
            row = cursor.execute(
                "UPDATE rhumbatron_partitions SET pending = NULL, "
                'progress = (progress::jsonb || \'{"pending_effects": "0"}\')::json '
                "WHERE id = %s AND epoch = %s RETURNING 1",
                (pid, epoch),
            ).fetchone()
            if row is None:
                current = cursor.execute(
                    "SELECT epoch FROM rhumbatron_partitions WHERE id = %s", (pid,)
                ).fetchone()
                raise Fenced(tp, epoch, int(current[0]) if current else 0)

        self.db.write(f"clearing {tp}'s pending effects", clear)

    def count_failure(self, tp: TP, batch_key: str) -> int:
        def count(cursor: Cursor) -> int:
            pid = self._id(cursor, tp, create=True)
            now = self._now_ms()
            row = cursor.execute(
                "INSERT INTO rhumbatron_failures (partition_id, batch_key, count, expires_ms) "
                "VALUES (%s, %s, 1, %s) ON CONFLICT (partition_id, batch_key) DO UPDATE SET "
                "count = CASE WHEN rhumbatron_failures.expires_ms <= %s THEN 1 "
                "ELSE rhumbatron_failures.count + 1 END, expires_ms = EXCLUDED.expires_ms "
                "RETURNING count",
                (pid, batch_key, now + self.failure_ttl_s * 1000, now),
            ).fetchone()
            assert row is not None
            return int(row[0])

        return self.db.write(f"counting a failure of {tp}", count)

    def clear_failures(self, tp: TP, batch_key: str) -> None:
        def clear(cursor: Cursor) -> None:
            pid = self._id(cursor, tp, create=False)
            if pid is not None:
                cursor.execute(
                    "DELETE FROM rhumbatron_failures WHERE partition_id = %s AND batch_key = %s",
                    (pid, batch_key),
                )

        self.db.write(f"clearing a failure count of {tp}", clear)


_TAKEN_BACK: list[Query] = [
    ("ROLLBACK TO SAVEPOINT rh_commit", None),
    ("RELEASE SAVEPOINT rh_commit", None),
]


def _queries(event: EventStatements) -> list[Query]:
    """An event's statements as queries; one without parameters is sent as it is written (as
    psycopg sends a query without parameters: a ``%`` in it needs no doubling)."""
    return [(s.sql, s.params or None) for s in event.statements]


def _folds(pid: int, states: Mapping[str, str]) -> Query:
    """Upsert encoded fold states."""
    return (
        "INSERT INTO rhumbatron_folds (partition_id, project, state) "
        "SELECT %s, p, s::json FROM unnest(%s::text[], %s::text[]) AS u(p, s) "
        "ON CONFLICT (partition_id, project) DO UPDATE SET state = EXCLUDED.state",
        (pid, list(states), list(states.values())),
    )


def _exclusions(pid: int, add: Sequence[int], remove: Sequence[int]) -> list[Query]:
    """Offsets added to the excluded set, then those taken out of it, in that order."""
    out: list[Query] = []
    if add:
        out.append(
            (
                'INSERT INTO rhumbatron_excluded (partition_id, "offset") '
                "SELECT %s, o FROM unnest(%s::bigint[]) AS u(o) ON CONFLICT DO NOTHING",
                (pid, sorted(set(add))),
            )
        )
    if remove:
        out.append(
            (
                'DELETE FROM rhumbatron_excluded WHERE partition_id = %s AND "offset" = '
                "ANY(%s::bigint[])",
                (pid, list(remove)),
            )
        )
    return out
