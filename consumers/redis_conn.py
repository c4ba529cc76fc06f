"""Connecting to Redis with bounded timeouts; failures name the address tried.

:func:`connect` makes a client of one server, :func:`connect_cluster` one of a Redis Cluster
(``redis.cluster.RedisCluster``, typed here as ``redis.Redis``: the stores call the commands both
offer). On a cluster, a script's keys and a ``MULTI``'s keys must share one hash slot, and the
stores keep that: every key of one (subscription, partition) carries the partition's hash tag.
:func:`run_script_calls` sends each call to the primary of its slot and, when asked, ends with
``WAIT`` there, on the same connection (``WAIT`` counts the writes of its own connection).

:func:`redis_errors` is the boundary for the readers an operator calls (views, dead letters,
worker figures): a redis-py error raised inside becomes :class:`Unreachable` (no answer) or
:class:`ServerRefused` (an error answer), naming the address and what was being done. The
runtime's loops do not use it: their retry policy takes redis-py's errors as they are.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any, cast
from urllib.parse import unquote, urlsplit, urlunsplit

import redis
from redis.cluster import ClusterNode, RedisCluster

from streams.errors import ConfigurationError, ReplicasBehind, ServerRefused, Unreachable

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


def is_cluster(client: redis.Redis[bytes]) -> bool:
    """Whether ``client`` is a Redis Cluster's (see :func:`connect_cluster`)."""
    return _cluster_of(client) is not None


def _cluster_of(client: redis.Redis[bytes]) -> RedisCluster[bytes] | None:
    # connect_cluster types its client as redis.Redis; this is where it is told apart.
    found: object = client
    return found if isinstance(found, RedisCluster) else None


@dataclass(frozen=True)
class Wait:
    """``WAIT replicas timeout_ms`` after a write: fewer acknowledgements fail the write."""

    replicas: int
    timeout_ms: int


Calls = Sequence[tuple[Sequence[str | bytes], Sequence[str | bytes | int]]]


def run_script_calls(
    client: redis.Redis[bytes], script: Script, calls: Calls, *, wait: Wait | None = None
) -> list[Any]:
    """Run ``script`` once per (keys, args) of ``calls``, all in one pipeline (one round trip,
    no transaction: each call is atomic on its own, and may keep its own hash slot); answers in
    order. A script Redis does not know (its cache flushed, or Redis restarted) is loaded and
    the calls it refused, which ran nothing, are sent again. redis-py's own ``Script`` in a
    pipeline asks ``SCRIPT EXISTS`` first on every execute: a second round trip each time.

    On a cluster the calls go in one pipeline per primary, to the primary of their first key's
    slot. With ``wait``, each pipeline ends with ``WAIT``; fewer acknowledgements than asked is
    :class:`ReplicasBehind`, raised after every call ran (their writes stand on the primary)."""
    cluster = _cluster_of(client)
    if cluster is not None:
        return _run_on_cluster(cluster, script, calls, wait)
    return _run_on(client, client, script, calls, wait, client_address(client))


def _run_on(
    client: redis.Redis[bytes],
    loader: Any,
    script: Script,
    calls: Calls,
    wait: Wait | None,
    address: str,
) -> list[Any]:
    answers: list[Any] = [None] * len(calls)
    todo = list(range(len(calls)))
    for attempt in range(2):
        pipe = client.pipeline(transaction=False)
        for i in todo:
            keys, args = calls[i]
            pipe.evalsha(script.sha, len(keys), *keys, *args)
        if wait is not None:
            pipe.execute_command("WAIT", wait.replicas, wait.timeout_ms)
        results = pipe.execute(raise_on_error=False)
        if wait is not None:
            acknowledged = results.pop()
            if isinstance(acknowledged, Exception):
                raise acknowledged
        again: list[int] = []
        for i, result in zip(todo, results, strict=True):
            if isinstance(result, redis.exceptions.NoScriptError) and attempt == 0:
                again.append(i)
            elif isinstance(result, Exception):
                raise result
            else:
                answers[i] = result
        if wait is not None and int(acknowledged) < wait.replicas:
            raise ReplicasBehind(address, wait.replicas, wait.timeout_ms, int(acknowledged))
        if not again:
            break
        loader.script_load(script.text)
        todo = again
    return answers


def _run_on_cluster(
    client: RedisCluster[bytes], script: Script, calls: Calls, wait: Wait | None
) -> list[Any]:
    by_node: dict[str, tuple[ClusterNode, list[int]]] = {}
    for i, (keys, _) in enumerate(calls):
        node = client.get_node_from_key(keys[0])
        assert node is not None  # a primary is asked for: None is for a missing replica
        by_node.setdefault(node.name, (node, []))[1].append(i)
    answers: list[Any] = [None] * len(calls)
    for name, (node, indexes) in by_node.items():
        primary = client.get_redis_connection(node)
        try:
            got = _run_on(primary, client, script, [calls[i] for i in indexes], wait, name)
        except (redis.ConnectionError, redis.TimeoutError, redis.ResponseError) as exc:
            # A primary gone (killed, failed over) or a slot moved (MOVED): the map of slots is
            # read again, so the caller's retry goes to the slot's new primary.
            if not isinstance(exc, redis.exceptions.NoScriptError):
                _reread_slots(client)
            raise
        for i, answer in zip(indexes, got, strict=True):
            answers[i] = answer
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
    _, _, bare_url = _split_credentials(url)
    client: redis.Redis[bytes] = redis.Redis.from_url(
        bare_url,
        retry_on_timeout=False,
        **_options(url, timeout, username, password, (ssl_ca_file, ssl_cert_file, ssl_key_file)),
    )
    try:
        client.ping()
    except redis.RedisError as exc:
        client.close()
        raise Unreachable(
            "Redis", address_of(url), f"{type(exc).__name__}: {exc}{_login_hint(exc)}"
        ) from exc
    return client


def _reread_slots(client: RedisCluster[bytes]) -> None:
    # Still failing over, the map may not be readable: the next retry asks again.
    with suppress(redis.RedisError, redis.exceptions.RedisClusterException):
        client.nodes_manager.initialize()


def connect_cluster(
    seeds: str,
    *,
    url: str,
    timeout: float,
    username: str | None = None,
    password: str | None = None,
    ssl_ca_file: str | None = None,
    ssl_cert_file: str | None = None,
    ssl_key_file: str | None = None,
) -> redis.Redis[bytes]:
    """A client of the Redis Cluster whose seed nodes ``seeds`` names (``host:port,...``, as
    RHUMBATRON_REDIS_CLUSTER holds them); the login and TLS come from ``url`` and the rest as for
    :func:`connect`. The map of slots is read here, so unreachable seeds, or a seed that is not
    in cluster mode, are reported here.

    Typed as ``redis.Redis``: the stores use the commands both clients offer, and the cluster's
    own rules (one slot a script or a ``MULTI``) are kept by the keys' hash tags."""
    options = _options(url, timeout, username, password, (ssl_ca_file, ssl_cert_file, ssl_key_file))
    if urlsplit(url).scheme == "rediss":
        options["ssl"] = True
    nodes = []
    for seed in seeds.split(","):
        host, _, port = seed.strip().rpartition(":")
        nodes.append(ClusterNode(host, int(port)))
    try:
        client: RedisCluster[bytes] = RedisCluster(startup_nodes=nodes, **options)
        client.ping(target_nodes=RedisCluster.PRIMARIES)
    except redis.exceptions.RedisClusterException as exc:
        if "cluster mode is not enabled" in str(exc).lower():
            raise ConfigurationError(
                f"RHUMBATRON_REDIS_CLUSTER={seeds}: {exc}; name the nodes of a Redis Cluster "
                "there, or unset it to use the single server of RHUMBATRON_REDIS_URL"
            ) from exc
        raise Unreachable(
            "Redis Cluster",
            seeds,
            f"{type(exc).__name__}: {exc}; check RHUMBATRON_REDIS_CLUSTER (its seed nodes) "
            "and that the cluster is up (infra/local.sh redis-cluster-up locally)",
        ) from exc
    except redis.RedisError as exc:
        raise Unreachable(
            "Redis Cluster",
            seeds,
            f"{type(exc).__name__}: {exc}{_login_hint(exc)}; check RHUMBATRON_REDIS_CLUSTER",
        ) from exc
    return cast("redis.Redis[bytes]", client)


def _options(
    url: str,
    timeout: float,
    username: str | None,
    password: str | None,
    tls_files: tuple[str | None, str | None, str | None],
) -> dict[str, Any]:
    """What either client is made with: the login (one given apart wins over the URL's), every
    call bounded by ``timeout``, idle connections pinged, and the TLS files given (the CA bundle,
    the client certificate, its key; the settings allow them with ``rediss://`` only)."""
    url_username, url_password, _ = _split_credentials(url)
    options: dict[str, Any] = {
        "username": username if username is not None else url_username,
        "password": password if password is not None else url_password,
        "socket_connect_timeout": timeout,
        "socket_timeout": timeout,
        "health_check_interval": HEALTH_CHECK_INTERVAL_S,
    }
    for key, path in zip(("ssl_ca_certs", "ssl_certfile", "ssl_keyfile"), tls_files, strict=True):
        if path is not None:
            options[key] = path
    return options


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
    """The address a client talks to, for messages (``host:port``, or a unix socket's path;
    a cluster's primaries, ``host:port,host:port ...``)."""
    cluster = _cluster_of(client)
    if cluster is not None:
        return ",".join(sorted(n.name for n in cluster.get_primaries())) or "Redis Cluster"
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
