"""The outbox's behaviour tests run as one contract over both backends: ``outbox_backend`` is a
fresh SQLite file or a fresh PostgreSQL schema (on the server infra/local.sh runs), per test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.streams.outbox.schema_v1 import install_through, install_v1
from tests.support.outbox import OutboxBackend

BACKENDS = [
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgres", id="postgres", marks=pytest.mark.integration),
]


@pytest.fixture(params=BACKENDS)
def outbox_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[OutboxBackend]:
    backend = OutboxBackend(request.param, tmp_path)
    yield backend
    backend.close()


@pytest.fixture
def pg(tmp_path: Path) -> Iterator[OutboxBackend]:
    """A fresh PostgreSQL outbox schema, for the tests that are about PostgreSQL alone."""
    backend = OutboxBackend("postgres", tmp_path)
    yield backend
    backend.close()


@pytest.fixture
def pg_v1(tmp_path: Path) -> Iterator[OutboxBackend]:
    """A fresh PostgreSQL outbox of schema version 1 (the release before's): its INSERT checks
    only what version 1 did."""
    from tests.support.postgres import FreshSchema

    backend = OutboxBackend("postgres", tmp_path)
    assert backend.schema is not None
    backend.schema.drop()
    backend.schema = FreshSchema(init=False)
    install_v1(backend.schema.url)
    yield backend
    backend.close()


@pytest.fixture
def pg_v2(tmp_path: Path) -> Iterator[OutboxBackend]:
    """A fresh PostgreSQL outbox of schema version 2 (the release before the outbox's identity):
    it holds no identity."""
    from tests.support.postgres import FreshSchema

    backend = OutboxBackend("postgres", tmp_path)
    assert backend.schema is not None
    backend.schema.drop()
    backend.schema = FreshSchema(init=False)
    install_through(backend.schema.url, 2)
    yield backend
    backend.close()
