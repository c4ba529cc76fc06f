"""The local PostgreSQL server (infra/local.sh) for tests: its URL, and a fresh outbox per test in
a schema of its own (the URL's search_path names it), dropped afterwards.

The server is the one ``make up`` starts on 127.0.0.1:5432 with the ``rhumbatron`` role, whose
password infra/local.sh keeps in ``.local/postgres/password``. ``RHUMBATRON_TEST_POSTGRES_URL``
points the tests at another server (a role that may create schemas in its database).
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from urllib.parse import quote

import psycopg
from psycopg import sql

from streams.outbox.postgres import init_outbox
from tests.support.environment import ROOT

PASSWORD_FILE = Path(ROOT) / ".local" / "postgres" / "password"


def server_url() -> str:
    url = os.environ.get("RHUMBATRON_TEST_POSTGRES_URL")
    if url:
        return url
    if not PASSWORD_FILE.exists():
        raise RuntimeError(
            f"no PostgreSQL for the tests: {PASSWORD_FILE} is missing; run `make up` (or "
            "infra/local.sh postgres-start)"
        )
    password = PASSWORD_FILE.read_text().strip()
    return f"postgresql://rhumbatron:{quote(password)}@127.0.0.1:5432/rhumbatron"


def with_schema(url: str, schema: str) -> str:
    joiner = "&" if "?" in url else "?"
    return f"{url}{joiner}options={quote(f'-csearch_path={schema}')}"


class FreshSchema:
    """A schema of its own on the test server (or on the server ``base`` names: a private one);
    ``url`` reaches it (search_path), ``drop`` ends it (terminating whatever sessions a test left
    behind)."""

    def __init__(self, *, init: bool = True, base: str | None = None) -> None:
        self.base = base or server_url()
        self.name = f"t_{secrets.token_hex(6)}"
        with psycopg.connect(self.base, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(self.name)))
        self.url = with_schema(self.base, self.name)
        if init:
            init_outbox(self.url)

    def connect(
        self, *, autocommit: bool = False, application_name: str = "rhumbatron tests"
    ) -> psycopg.Connection[tuple[object, ...]]:
        return psycopg.connect(self.url, autocommit=autocommit, application_name=application_name)

    def drop(self) -> None:
        with psycopg.connect(self.base, autocommit=True) as conn:
            conn.execute(
                "SELECT pg_terminate_backend(l.pid) FROM pg_locks l JOIN pg_class c "
                "ON c.oid = l.relation JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = %s AND l.pid <> pg_backend_pid()",
                (self.name,),
            )
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(self.name)))
