"""An outbox of an older schema version (1, or 2), as a database made by an earlier release
looks: the rows it takes and the publishers that read it, before and after ``outbox migrate``."""

from __future__ import annotations

import psycopg
from psycopg import sql

from streams.outbox import postgres_checks
from streams.outbox.postgres import DEFAULT_MAX_ENVELOPE_BYTES, schema_sql


def install_v1(url: str) -> None:
    """Apply version 1 alone to the (empty) first schema of ``url``'s search_path."""
    install_through(url, 1)


def install_through(url: str, version: int) -> None:
    """Apply versions 1 to ``version`` (an older release's outbox) to the (empty) first schema
    of ``url``'s search_path."""
    with psycopg.connect(url) as conn:
        found = conn.execute("SELECT current_schema()").fetchone()
        assert found is not None and found[0], "the URL's search_path names no schema"
        conn.execute(sql.SQL("SET LOCAL search_path = {}").format(sql.Identifier(found[0])))
        for step in range(1, version + 1):
            conn.execute(schema_sql(step).encode())
        if version >= 2:  # what the INSERT's checks read, as that release's init wrote them
            postgres_checks.write(conn, max_envelope_bytes=DEFAULT_MAX_ENVELOPE_BYTES)
