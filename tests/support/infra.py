"""Private Kafka, Redis and PostgreSQL instances for chaos tests.

A chaos test that stops, kills or restarts a server must not disturb the shared servers other
tests use, so it starts its own through infra/local.sh with a private state folder and free
ports (the Kafka jars are shared). ``PrivateServices`` is a context manager.

With ``kafka_proxy`` or ``redis_proxy`` it also puts a TCP proxy (tests/support/tcp_proxy.py) in
front of the broker or Redis, for rows that cut the network rather than kill a server: the
broker gets a listener that advertises the proxy's address (infra/local.sh), so clients
bootstrapped at :attr:`proxied_bootstrap` cannot bypass the proxy, while :attr:`bootstrap` stays
a direct way in for the test's own checks.
"""

from __future__ import annotations

import os
import random
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path
from types import TracebackType
from urllib.parse import quote

from tests.support.environment import ROOT
from tests.support.tcp_proxy import TcpProxy

LOCAL_SH = ROOT / "infra" / "local.sh"
PORT_FLOOR = 11000  # private ports start above the shared ones (9092-9094, 10092, 6379, 5432)
REDIS_CLUSTER_NODES = 6  # infra/local.sh's: 3 masters, 3 replicas
# What infra/local.sh says when it makes a PostgreSQL cluster: the folder after it holds the
# cluster, outside the state folder when run as root (initdb refuses root; the cluster belongs
# to the postgres user), so it is removed apart from it.
_PG_INIT = "initialising a PostgreSQL cluster in "


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _ephemeral_floor() -> int:
    """The lowest port the kernel hands out as the local end of outgoing connections."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def _pick_port(span: int = 1, offsets: tuple[int, ...] = (0,)) -> int:
    """A port P such that P..P+span-1 (and each +offset) are free, all below the kernel's
    ephemeral range: a port in it that a test leaves unbound for a while (a broker killed, a node
    still starting) can meanwhile become the local end of some outgoing connection (or a client's
    self-connect to the dead port), and the server then cannot bind it again."""
    top = _ephemeral_floor() - span - max(offsets)
    for _ in range(200):
        base = random.randrange(PORT_FLOOR, top)
        if all(_free(base + i + off) for i in range(span) for off in offsets):
            return base
    raise RuntimeError(f"no free port range found between {PORT_FLOOR} and {top}")


class PrivateServices:
    """A broker (or a 3-node cluster) and a Redis of this test's own.

    >>> with PrivateServices() as svc:
    ...     svc.kafka_stop(); svc.kafka_start()

    With ``cluster``, entering starts the 3-node cluster (nodes 1-3, :attr:`cluster_bootstrap`)
    instead of the single broker. With ``redis_cluster``, entering also starts a Redis Cluster of
    3 masters and 3 replicas on six ports of its own (:attr:`redis_cluster_nodes`). With
    ``postgres``, entering also starts a PostgreSQL server of its own (:attr:`postgres_url`, the
    ``rhumbatron`` role and database as infra/local.sh makes them); leaving removes its cluster.
    """

    def __init__(
        self,
        *,
        kafka: bool = True,
        redis: bool = True,
        cluster: bool = False,
        redis_cluster: bool = False,
        postgres: bool = False,
        kafka_proxy: bool = False,
        redis_proxy: bool = False,
    ) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="rhumbatron-private-"))
        # Controllers listen 10000 above each broker port, the single broker's secured listener
        # 1000 above it; the cluster uses three ports.
        # (and a proxied listener 2000 above it).
        self.kafka_port = _pick_port(3, (0, 1000, 2000, 10000)) if kafka else 0
        self.redis_port = _pick_port() if redis else 0
        # Each cluster node's bus listens 10000 above its port.
        self.redis_cluster_port = (
            _pick_port(REDIS_CLUSTER_NODES, (0, 10000)) if redis_cluster else 0
        )
        self.postgres_port = _pick_port() if postgres else 0
        self._pg_home: Path | None = None
        self._want_redis_cluster = redis_cluster
        self._want_kafka = kafka
        self._want_redis = redis
        self._want_cluster = kafka and cluster
        self.kafka_proxy: TcpProxy | None = None
        self.redis_proxy: TcpProxy | None = None
        if kafka and kafka_proxy and not cluster:
            self.kafka_proxy = TcpProxy(("127.0.0.1", self.kafka_port + 2000), port=_pick_port())
        if redis and redis_proxy:
            self.redis_proxy = TcpProxy(("127.0.0.1", self.redis_port), port=_pick_port())

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.kafka_port}"

    @property
    def proxied_bootstrap(self) -> str:
        """The broker through the proxy: every connection a client makes goes through it."""
        assert self.kafka_proxy is not None, "PrivateServices(kafka_proxy=True) has the proxy"
        return self.kafka_proxy.address

    @property
    def proxied_redis_url(self) -> str:
        assert self.redis_proxy is not None, "PrivateServices(redis_proxy=True) has the proxy"
        return f"redis://{self.redis_proxy.address}/0"

    @property
    def secured_bootstrap(self) -> str:
        return f"127.0.0.1:{self.kafka_port + 1000}"

    @property
    def secured_dir(self) -> Path:
        return self.dir / "kafka" / "secured"

    @property
    def cluster_bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{self.kafka_port + i}" for i in range(3))

    @property
    def redis_url(self) -> str:
        return f"redis://127.0.0.1:{self.redis_port}/0"

    @property
    def redis_cluster_nodes(self) -> list[str]:
        """Every node's ``host:port``, masters and replicas (which is which changes on failover)."""
        return [f"127.0.0.1:{self.redis_cluster_port + i}" for i in range(REDIS_CLUSTER_NODES)]

    @property
    def redis_cluster_seeds(self) -> str:
        """The value of RHUMBATRON_REDIS_CLUSTER for this cluster."""
        return ",".join(self.redis_cluster_nodes)

    @property
    def postgres_url(self) -> str:
        password = (self.dir / "postgres" / "password").read_text().strip()
        return (
            f"postgresql://rhumbatron:{quote(password)}@127.0.0.1:{self.postgres_port}/rhumbatron"
        )

    def run(self, *args: str) -> str:
        env = dict(os.environ)
        env.update(
            RHUMBATRON_LOCAL_DIR=str(self.dir),
            RHUMBATRON_KAFKA_PORT=str(self.kafka_port or 9092),
            RHUMBATRON_REDIS_PORT=str(self.redis_port or 6379),
            RHUMBATRON_REDIS_CLUSTER_PORT=str(self.redis_cluster_port or 7000),
            RHUMBATRON_POSTGRES_PORT=str(self.postgres_port or 5432),
        )
        if self.kafka_proxy is not None:
            env["RHUMBATRON_KAFKA_PROXY_PORT"] = str(self.kafka_proxy.port)
        result = subprocess.run(
            [str(LOCAL_SH), *args], env=env, capture_output=True, text=True, timeout=180
        )
        if result.returncode != 0:
            raise RuntimeError(
                f"infra/local.sh {' '.join(args)} failed:\n{result.stdout}{result.stderr}"
            )
        return result.stdout

    def kafka_start(self, node: str = "") -> None:
        self.run("kafka-start", *([node] if node else []))

    def kafka_stop(self, node: str = "") -> None:
        self.run("kafka-stop", *([node] if node else []))

    def kafka_kill(self, node: str = "") -> None:
        self.run("kafka-kill", *([node] if node else []))

    def redis_start(self) -> None:
        self.run("redis-start")

    def redis_stop(self) -> None:
        self.run("redis-stop")

    def redis_kill(self) -> None:
        self.run("redis-kill")

    def redis_snapshot(self, path: Path) -> None:
        """A snapshot (RDB) of the running Redis written to ``path`` (docs/operations.md)."""
        self.run("redis-snapshot", str(path))

    def redis_restore(self, path: Path) -> None:
        """Redis stopped and restored from the snapshot at ``path``, append-only again."""
        self.run("redis-restore", str(path))

    def postgres_start(self) -> None:
        said = self.run("postgres-start")
        if _PG_INIT in said:
            self._pg_home = Path(said.split(_PG_INIT, 1)[1].split()[0]).parent

    def postgres_stop(self) -> None:
        self.run("postgres-stop")

    def postgres_kill(self) -> None:
        """SIGKILL the server (no checkpoint, no shutdown): it recovers from its WAL on start."""
        self.run("postgres-kill")

    def redis_wipe(self) -> None:
        """Redis stopped and its data files deleted (the append-only files and any snapshot):
        started again (:meth:`redis_start`), it is empty, as a Redis that lost its disk or was
        replaced by a fresh one."""
        self.redis_stop()
        data = self.dir / "redis"
        for path in data.iterdir():
            if path.name in ("redis.conf", "redis.log"):
                continue
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink()

    def cluster_up(self) -> None:
        self.run("cluster-up")

    def redis_cluster_up(self) -> None:
        self.run("redis-cluster-up")

    def redis_cluster_kill(self, port: int) -> None:
        """SIGKILL the cluster node on ``port`` (no shutdown, no last fsync)."""
        self.run("redis-cluster-kill", str(port))

    def __enter__(self) -> PrivateServices:
        try:
            if self._want_cluster:
                self.cluster_up()
            elif self._want_kafka:
                self.kafka_start()
            if self._want_redis:
                self.redis_start()
            if self._want_redis_cluster:
                self.redis_cluster_up()
            if self.postgres_port:
                self.postgres_start()
            for proxy in (self.kafka_proxy, self.redis_proxy):
                if proxy is not None:
                    proxy.start()
        except BaseException:
            # A cluster half up holds a JVM per node started: stop them, not only report.
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            for proxy in (self.kafka_proxy, self.redis_proxy):
                if proxy is not None:
                    proxy.close()
            self.run("down")
        finally:
            if self._pg_home is not None:
                shutil.rmtree(self._pg_home, ignore_errors=True)
            shutil.rmtree(self.dir, ignore_errors=True)
