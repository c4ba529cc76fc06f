"""Connecting to Redis with bounded timeouts; failures name the address tried.

:func:`redis_errors` is the boundary for the readers an operator calls (views, dead letters,
worker figures): a redis-py error raised inside becomes :class:`Unreachable` (no answer) or
:class:`ServerRefused` (an error answer), naming the address and what was being done. The
runtime's loops do not use it: their retry policy takes redis-py's errors as they are.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

import redis

from streams.errors import ServerRefused, Unreachable

# A connection idle this long is pinged before it is used again, so one a server restart
# dropped is replaced instead of failing the next command.
HEALTH_CHECK_INTERVAL_S = 30


@dataclass(frozen=True)
class Script:
    """A Lua script by its text and SHA1, run with :func:`run_script_calls`."""

    text: str
    sha: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sha", hashlib.sha1(self.text.encode()).hexdigest())


def run_script_calls(
    client: redis.Redis[bytes],
    script: Script,
    calls: Sequence[tuple[Sequence[str | bytes], Sequence[str | bytes | int]]],
) -> list[Any]:
    """Run ``script`` once per (keys, args) of ``calls``, all in one pipeline (one round trip,
    no transaction: each call is atomic on its own, and may keep its own hash slot); answers in
    order. A script Redis does not know (its cache flushed, or Redis restarted) is loaded and
    the calls it refused, which ran nothing, are sent again. redis-py's own ``Script`` in a
    pipeline asks ``SCRIPT EXISTS`` first on every execute: a second round trip each time."""
    answers: list[Any] = [None] * len(calls)
    todo = list(range(len(calls)))
    for attempt in range(2):
        pipe = client.pipeline(transaction=False)
        for i in todo:
            keys, args = calls[i]
            pipe.evalsha(script.sha, len(keys), *keys, *args)
        results = pipe.execute(raise_on_error=False)
        again: list[int] = []
        for i, result in zip(todo, results, strict=True):
            if isinstance(result, redis.exceptions.NoScriptError) and attempt == 0:
                again.append(i)
            elif isinstance(result, Exception):
                raise result
            else:
                answers[i] = result
        if not again:
            break
        client.script_load(script.text)
        todo = again
    return answers


def address_of(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.hostname or '?'}:{parts.port or 6379}"


def connect(
    url: str,
    *,
    timeout: float,
    username: str | None = None,
    password: str | None = None,
    ssl_ca_file: str | None = None,
    ssl_cert_file: str | None = None,
    ssl_key_file: str | None = None,
) -> redis.Redis[bytes]:
    """A client whose every call is bounded by ``timeout``; pinged once so a dead server, or a
    refused login, is reported here, naming the address, instead of on first use.

    The credentials may be in ``url`` (``redis://user:password@host``) or given apart; one given
    apart wins over the URL's. The ``ssl_*`` files apply to a ``rediss://`` URL: the CA bundle the
    server's certificate is checked against, and a client certificate and its key for a server
    that asks for one (``tls-auth-clients``)."""
    url_username, url_password, bare_url = _split_credentials(url)
    options: dict[str, Any] = {}
    if ssl_ca_file is not None:
        options["ssl_ca_certs"] = ssl_ca_file
    if ssl_cert_file is not None:
        options["ssl_certfile"] = ssl_cert_file
    if ssl_key_file is not None:
        options["ssl_keyfile"] = ssl_key_file
    client: redis.Redis[bytes] = redis.Redis.from_url(
        bare_url,
        username=username if username is not None else url_username,
        password=password if password is not None else url_password,
        socket_connect_timeout=timeout,
        socket_timeout=timeout,
        health_check_interval=HEALTH_CHECK_INTERVAL_S,
        retry_on_timeout=False,
        **options,
    )
    try:
        client.ping()
    except redis.RedisError as exc:
        client.close()
        raise Unreachable(
            "Redis", address_of(url), f"{type(exc).__name__}: {exc}{_login_hint(exc)}"
        ) from exc
    return client


def _split_credentials(url: str) -> tuple[str | None, str | None, str]:
    """The user and password a URL carries, and the URL without them: redis-py lets a URL's
    credentials win over its keyword arguments, and ours must lose to the separate settings."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return None, None, url
    username = unquote(parts.username) if parts.username else None
    password = unquote(parts.password) if parts.password is not None else None
    bare = urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))
    return username, password, bare


def _login_hint(exc: redis.RedisError) -> str:
    # redis-py's own words never carry the password; ours say which settings give the login.
    if isinstance(exc, redis.AuthenticationError) or "NOAUTH" in str(exc):
        return (
            "; the server refused the login: check the user and password "
            "(RHUMBATRON_REDIS_USERNAME, RHUMBATRON_REDIS_PASSWORD, or user:password@ in "
            "RHUMBATRON_REDIS_URL)"
        )
    return ""


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
