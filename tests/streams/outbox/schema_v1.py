"""An outbox of schema version 1, as a database made by the release before looks: the rows it
takes and the publishers that read it, before and after ``outbox migrate``."""

from __future__ import annotations

import psycopg
from psycopg import sql

from streams.outbox.postgres import schema_sql


def install_v1(url: str) -> None:
    """Apply version 1 alone to the (empty) first schema of ``url``'s search_path."""
    with psycopg.connect(url) as conn:
        found = conn.execute("SELECT current_schema()").fetchone()
        assert found is not None and found[0], "the URL's search_path names no schema"
        conn.execute(sql.SQL("SET LOCAL search_path = {}").format(sql.Identifier(found[0])))
        conn.execute(schema_sql(1).encode())
