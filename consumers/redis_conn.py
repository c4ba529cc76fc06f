"""Connecting to Redis with bounded timeouts; failures name the address tried.

:func:`redis_errors` is the boundary for the readers an operator calls (views, dead letters,
worker figures): a redis-py error raised inside becomes :class:`Unreachable` (no answer) or
:class:`ServerRefused` (an error answer), naming the address and what was being done. The
runtime's loops do not use it: their retry policy takes redis-py's errors as they are.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit

import redis

from streams.errors import ServerRefused, Unreachable

# A connection idle this long is pinged before it is used again, so one a server restart
# dropped is replaced instead of failing the next command.
HEALTH_CHECK_INTERVAL_S = 30


def address_of(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.hostname or '?'}:{parts.port or 6379}"


def connect(url: str, *, timeout: float) -> redis.Redis[bytes]:
    """A client whose every call is bounded by ``timeout``; pinged once so a dead server is
    reported here, naming the address, instead of on first use."""
    client = redis.Redis.from_url(
        url,
        socket_connect_timeout=timeout,
        socket_timeout=timeout,
        health_check_interval=HEALTH_CHECK_INTERVAL_S,
        retry_on_timeout=False,
    )
    try:
        client.ping()
    except redis.RedisError as exc:
        raise Unreachable("Redis", address_of(url), f"{type(exc).__name__}: {exc}") from exc
    return client


def client_address(client: redis.Redis[bytes]) -> str:
    """The address a client talks to, for messages (``host:port``, or a unix socket's path)."""
    kwargs = client.connection_pool.connection_kwargs
    if "path" in kwargs:
        return str(kwargs["path"])
    return f"{kwargs.get('host', '?')}:{kwargs.get('port', 6379)}"


@contextmanager
def redis_errors(client: redis.Redis[bytes], doing: str) -> Iterator[None]:
    """Translate a redis-py error raised inside into one of ours, naming the address and
    ``doing`` (what was being read or written, e.g. "reading the view of project P")."""
    try:
        yield
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise Unreachable(
            "Redis", client_address(client), f"{doing}: {type(exc).__name__}: {exc}"
        ) from exc
    except redis.RedisError as exc:
        raise ServerRefused(
            "Redis", client_address(client), f"{doing}: {type(exc).__name__}: {exc}{_hint(exc)}"
        ) from exc


def _hint(exc: redis.RedisError) -> str:
    text = str(exc)
    if "WRONGTYPE" in text:  # a pipeline says "Command # n (…) of pipeline caused error: …"
        return (
            "; a key of ours holds another type: something else writes this environment's keys "
            "on this Redis (give it its own database, or another RHUMBATRON_ENV)"
        )
    if "READONLY" in text:
        return "; this Redis is a read-only replica: point RHUMBATRON_REDIS_URL at the primary"
    return ""
