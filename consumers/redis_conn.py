"""Connecting to Redis with bounded timeouts; failures name the address tried."""

from __future__ import annotations

from urllib.parse import urlsplit

import redis

from streams.errors import Unreachable

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
