"""What a PostgreSQL outbox says when its server cannot be reached, without a server: the
reason libpq gave (connection refused), not the hint it prints after it."""

from __future__ import annotations

import socket

import pytest

from streams.errors import Unreachable
from streams.outbox.postgres import connect


def _closed_port() -> int:
    """A port nothing listens on: bound for a moment, then let go."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_refused_connection_says_it_was_refused() -> None:
    port = _closed_port()
    with pytest.raises(Unreachable) as refused:
        connect(
            f"postgresql://rhumbatron:s3cret-pw@127.0.0.1:{port}/some_db",
            timeout_s=2,
            autocommit=True,
            application_name="rhumbatron tests",
        )
    message = str(refused.value)
    assert f"host 127.0.0.1 port {port} database some_db" in message
    assert "Connection refused" in message, message
    assert "\t" not in message and "\n" not in message, message
    assert "s3cret-pw" not in message
