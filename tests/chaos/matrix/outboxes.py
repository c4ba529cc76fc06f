"""The row's outbox: a SQLite file in the environment's folder, or a PostgreSQL schema of the
row's own (on the shared server, or on the row's private one, which the row may kill). The
runner writes through its store and the publisher reads it by its address; the checks read its
tables directly (:meth:`RowOutbox.rows`), not through the store whose behaviour is under test."""

from __future__ import annotations

import logging
import sqlite3
from contextlib import closing, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from router.settings import Settings
from router.wiring.outbox import open_outbox
from streams.outbox.store import OutboxStore
from tests.chaos.matrix.scenarios import Outbox
from tests.support.infra import PrivateServices
from tests.support.outbox import outbox_for
from tests.support.postgres import FreshSchema


@dataclass(frozen=True, slots=True)
class StoredRow:
    """One outbox row as its table holds it."""

    event_id: str
    project_id: str
    slot: int
    state: str
    attempts: int
    deferrals: int
    last_error: str | None


class RowOutbox:
    """The outbox of one row, made fresh and removed with :meth:`close`."""

    def __init__(self, kind: Outbox, s: Settings, services: PrivateServices | None) -> None:
        self.kind = kind
        self._schema: FreshSchema | None = None
        self._path: Path | None = None
        self.store: OutboxStore
        if kind is Outbox.SQLITE:
            self._path = s.state_dir / "outbox.db"
            self._path.parent.mkdir(parents=True, exist_ok=True)
            self.address = str(self._path)
            self.store = outbox_for(s, self._path)
        else:
            # The runner's own store reconnecting while a row's server is down says so once a
            # second; the members' logs keep their own warnings.
            logging.getLogger("psycopg.pool").setLevel(logging.ERROR)
            private = services.postgres_url if services and services.postgres_port else None
            self._schema = FreshSchema(base=private)
            self.address = self._schema.url
            self.store = open_outbox(s, self.address, create=False)

    def query(self, text: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """Read the outbox's tables directly (``?`` placeholders)."""
        if self._schema is not None:
            with self._schema.connect() as pg:
                return list(pg.execute(text.replace("?", "%s").encode(), params).fetchall())
        assert self._path is not None
        with closing(sqlite3.connect(self._path, timeout=30)) as conn:
            return conn.execute(text, params).fetchall()

    def rows(self) -> list[StoredRow]:
        """Every row, in (project, slot) order."""
        return [
            StoredRow(r[0], r[1], int(r[2]), r[3], int(r[4]), int(r[5]), r[6])
            for r in self.query(
                "SELECT event_id, project_id, slot, state, attempts, deferrals, last_error "
                "FROM outbox ORDER BY project_id, slot"
            )
        ]

    def counters(self) -> dict[str, int]:
        """Each project's slot counter (``outbox_slots``)."""
        return {p: int(n) for p, n in self.query("SELECT project_id, last_slot FROM outbox_slots")}

    def published_by_project(self) -> dict[str, int]:
        return {
            p: int(n)
            for p, n in self.query(
                "SELECT project_id, COUNT(*) FROM outbox WHERE state = 'published' "
                "GROUP BY project_id"
            )
        }

    def close(self) -> None:
        self.store.close()
        if self._schema is not None:
            # Best effort, as the environment's cleanup is: the row's own result stands.
            with suppress(psycopg.Error):
                self._schema.drop()
