"""The fleet: the whole router as one supervised set of processes on one machine.

:func:`plan` turns the settings into :class:`Member` s, each one ``rhumbatron`` command line
(``consume``, ``publish``, ``pump``, ``worker``, ``dead-letter-consumer``, ``analytics-rollup``,
``serve``) with the environment that names it. :class:`Supervisor` starts them, restarts a member
that exits with a doubling backoff, gives up when one restarts more than ``fleet_max_restarts``
times within ``fleet_restart_window_s`` (it then stops every member and returns 1), and on
stop sends each member SIGTERM, waits ``fleet_stop_timeout_s`` for all of them (each finishes
its batch, commits, closes its archive parts and leaves its group: the commands' own graceful
stop) and kills what is left. It keeps :class:`FleetStatus` in a JSON file of the state
directory, which ``rhumbatron fleet status`` reads.

Each member is a process of its own: one consume loop per CPU core is how CPython scales, a crash
stays in its process, and what a member runs is exactly what an operator runs by hand.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any, Protocol

from consumers.lag import group_lag
from router.settings import Settings, worker_target
from router.wiring.groups import group_reads
from router.wiring.processors import check_subscription
from router.wiring.workers import check_http_url
from router.workers.handlers import load_handler
from streams.admin import admin_client
from streams.errors import ConfigurationError, InstanceIdHeld, LayoutNewer
from streams.topology import group_id, unknown_queue

log = logging.getLogger("rhumbatron.fleet")

SUPERVISE_INTERVAL_S = 0.2  # how often the supervisor looks at its members
STATUS_INTERVAL_S = 2.0  # how often it rewrites the status file while nothing changes
# The members that join a consumer group through the runtime's transport: those fleet_static_
# membership makes static. (The rollup's group is faust's; the publisher and pump join none.)
STATIC_COMMANDS = frozenset({"consume", "worker", "dead-letter-consumer"})


@dataclass(frozen=True)
class Member:
    """One process of the fleet: its name (unique in the fleet, e.g. ``causal-router-2``), the
    ``rhumbatron`` arguments it runs, and the environment it adds; ``group`` is the subscription
    whose consumer group it joins (for status), if any."""

    name: str
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    subscription: str | None = None


def plan(settings: Settings, outboxes: Sequence[str] = ()) -> list[Member]:
    """Every member the settings (and ``outboxes`` beside ``fleet_outboxes``) ask for, in the
    order they start: what writes the streams first, then what reads them, the server last. A
    wrong name or count is one ConfigurationError naming the setting."""
    partitions = len(settings.topology.stream_names()) * settings.partitions
    members: list[Member] = []
    for index, address in enumerate(dict.fromkeys([*settings.fleet_outboxes, *outboxes]), 1):
        members.append(Member(f"publisher-{index}", ("publish", "--outbox", address)))
    if settings.fleet_feed:
        members.append(Member("pump", ("pump", "--feed", settings.fleet_feed)))
    for slug, count in settings.fleet_subscriptions.items():
        try:
            check_subscription(settings, slug)
        except ConfigurationError as exc:
            raise ConfigurationError(f"RHUMBATRON_FLEET_SUBSCRIPTIONS: {exc}") from None
        if not 0 <= count <= partitions:
            raise ConfigurationError(
                f"RHUMBATRON_FLEET_SUBSCRIPTIONS: {slug}={count}: must be 0 to {partitions} "
                "(its partitions; a process past them would own none)"
            )
        # One member publishes an outbox: when a publisher member publishes the causal router's
        # outbox, the router's processes leave it to that member (router_publish_outbox).
        from router.wiring.causal import router_outbox_path  # the router's wiring: loaded here

        publishes = {m.argv[2] for m in members if m.argv[0] == "publish"}
        env = (
            {"RHUMBATRON_ROUTER_PUBLISH_OUTBOX": "false"}
            if slug == "causal-router" and str(router_outbox_path(settings)) in publishes
            else {}
        )
        for n in range(1, count + 1):
            members.append(Member(f"{slug}-{n}", ("consume", "--subscription", slug), env, slug))
    for purpose, value in settings.fleet_workers.items():
        if purpose not in settings.topology.queues:
            unknown = unknown_queue(purpose, settings.topology.queues)
            raise ConfigurationError(f"RHUMBATRON_FLEET_WORKERS: {unknown}")
        target = worker_target(value)
        try:
            # Checked here too: a wrong handler or URL stops the fleet at its start.
            if target.http is not None:
                check_http_url(target.http)
            else:
                load_handler(target.handler or "")
        except ConfigurationError as exc:
            raise ConfigurationError(f"RHUMBATRON_FLEET_WORKERS: {purpose}: {exc}") from None
        secrets = (
            {"RHUMBATRON_HTTP_HANDLER_SECRETS": target.http_secrets.get_secret_value()}
            if target.http_secrets is not None
            else {}
        )
        for n in range(1, settings.fleet_worker_processes + 1):
            members.append(
                Member(
                    f"worker-{purpose}-{n}",
                    ("worker", "--queue", purpose, *target.argv),
                    secrets,
                )
            )
    if settings.fleet_dead_letter_consumer:
        members.append(Member("dead-letter-consumer", ("dead-letter-consumer",)))
    if settings.fleet_analytics_rollup:
        members.append(Member("analytics-rollup", ("analytics-rollup",)))
    if settings.fleet_operator_server:
        members.append(Member("operator-server", ("serve",)))
    return [_named(settings, i, m) for i, m in enumerate(members)]


def _named(settings: Settings, index: int, member: Member) -> Member:
    env = {"RHUMBATRON_PROCESS_NAME": member.name}
    if settings.fleet_static_membership and member.argv[0] in STATIC_COMMANDS:
        env["RHUMBATRON_GROUP_INSTANCE_ID"] = f"{settings.fleet_instance_prefix}-{member.name}"
    if settings.fleet_metrics_port_base is not None:
        env["RHUMBATRON_METRICS_PORT"] = str(settings.fleet_metrics_port_base + index)
    return Member(member.name, member.argv, {**env, **member.env}, member.subscription)


# -- restarts ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RestartPolicy:
    backoff_s: float
    backoff_max_s: float
    max_restarts: int
    window_s: float

    held_wait_s: float = 10.0
    held_max_s: float = 300.0

    @classmethod
    def of(cls, settings: Settings) -> RestartPolicy:
        return cls(
            settings.fleet_restart_backoff_s,
            settings.fleet_restart_backoff_max_s,
            settings.fleet_max_restarts,
            settings.fleet_restart_window_s,
            settings.fleet_instance_held_wait_s,
            settings.fleet_instance_held_max_s,
        )

    def wait_s(self, restarts_in_window: int) -> float:
        """The wait before the next restart, the ``restarts_in_window``-th (1, 2, ...)."""
        return float(min(self.backoff_s * 2 ** max(restarts_in_window - 1, 0), self.backoff_max_s))


# -- status -------------------------------------------------------------------------------------------
@dataclass
class MemberStatus:
    name: str
    argv: list[str]
    subscription: str | None
    # starting | running | backoff | held (its static id not yet released) | stopping | stopped
    # | failed
    state: str = "starting"
    pid: int | None = None
    restarts: int = 0
    started_at: float | None = None  # wall clock, of the current (or last) process
    last_exit: int | None = None  # the last process's exit code (negative: killed by a signal)


@dataclass
class FleetStatus:
    env: str
    pid: int
    started_at: float
    updated_at: float
    state: str  # running | stopping | stopped | failed
    members: list[MemberStatus]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FleetStatus:
        members = [MemberStatus(**m) for m in data["members"]]
        return cls(**{**data, "members": members})


def status_path(settings: Settings) -> Path:
    return settings.state_dir / f"fleet-{settings.env}.json"


def write_status(path: Path, status: FleetStatus) -> None:
    """Atomically: a reader sees the last whole status, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    scratch = path.with_name(f".{path.name}.{os.getpid()}")
    scratch.write_text(json.dumps(status.as_dict(), indent=1), encoding="utf-8")
    os.replace(scratch, path)


def read_status(path: Path) -> FleetStatus | None:
    try:
        return FleetStatus.from_dict(json.loads(path.read_text(encoding="utf-8")))
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigurationError(f"{path}: not a fleet status file ({exc})") from None


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # somebody else's process: alive
        return True
    return True


# -- processes ------------------------------------------------------------------------------------------
class Child(Protocol):
    """What the supervisor needs of a started member (a ``subprocess.Popen`` is one)."""

    pid: int

    def poll(self) -> int | None: ...

    def send_signal(self, sig: int) -> None: ...

    def kill(self) -> None: ...


Spawn = Callable[[Member], Child]


def spawn_process(member: Member) -> Child:
    """Start ``member`` as ``python -m router.cli …`` in a session of its own (a terminal's
    Ctrl-C reaches the fleet, which stops its members in order), each line of its output
    prefixed with its name on the fleet's stderr."""
    process = subprocess.Popen(
        [sys.executable, "-m", "router.cli", *member.argv],
        env={**os.environ, **member.env},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    assert process.stdout is not None
    threading.Thread(
        target=_relay, args=(member.name, process.stdout, sys.stderr), daemon=True
    ).start()
    return process


def _relay(name: str, source: IO[bytes], sink: IO[str]) -> None:
    for line in iter(source.readline, b""):
        sink.write(f"[{name}] {line.decode('utf-8', 'replace')}")
        sink.flush()
    source.close()


@dataclass
class _Slot:
    member: Member
    status: MemberStatus
    child: Child | None = None
    start_at: float = 0.0  # monotonic: when a member in backoff starts again
    recent: list[float] = field(default_factory=list)  # monotonic times of its restarts
    held_since: float | None = None  # monotonic: its first exit for a held static id in a row


class Supervisor:
    """Runs the members until ``stop`` is set or one of them is given up on (see the module's
    docstring). ``spawn`` and ``clock`` are the seams the unit tests use."""

    def __init__(
        self,
        settings: Settings,
        members: Iterable[Member],
        *,
        spawn: Spawn = spawn_process,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
        status_file: Path | None = None,
    ) -> None:
        self.policy = RestartPolicy.of(settings)
        self.stop_timeout_s = settings.fleet_stop_timeout_s
        self.slots = [_Slot(m, MemberStatus(m.name, list(m.argv), m.subscription)) for m in members]
        names = [s.member.name for s in self.slots]
        if len(set(names)) != len(names):
            raise ConfigurationError(f"fleet members must have distinct names: {names}")
        self._spawn = spawn
        self._clock = clock
        self._wall = wall
        self._sleep = sleep
        self._status_file = status_file
        self.status = FleetStatus(settings.env, os.getpid(), wall(), wall(), "running", [])
        self.status.members = [s.status for s in self.slots]
        self._written = 0.0

    # -- the loop -----------------------------------------------------------------------------------
    def run(self, stop: threading.Event, *, interval_s: float = SUPERVISE_INTERVAL_S) -> int:
        """0 after a stop asked for, 1 after giving up on a member or killing one at the stop."""
        gave_up = False
        for slot in self.slots:
            self._start(slot)
        self._publish(force=True)
        while not stop.is_set():
            gave_up = self.step()
            if gave_up:
                break
            self._publish()
            stop.wait(interval_s)
        killed = self.stop_all()
        return 1 if gave_up or killed else 0

    def step(self) -> bool:
        """Look at every member once: note exits, start those whose backoff is over. True when
        a member has restarted too often (the fleet then stops)."""
        now = self._clock()
        changed = False
        if self.status.state == "failed":  # one could not even start
            return True
        for slot in self.slots:
            if slot.child is not None:
                code = slot.child.poll()
                if code is None:
                    continue
                changed = True
                self._exited(slot, code, now)
                if slot.status.state == "failed":
                    self._publish(force=True)
                    return True
            elif slot.status.state in ("backoff", "held") and now >= slot.start_at:
                changed = True
                slot.status.restarts += 1
                self._start(slot)
        if changed:
            self._publish(force=True)
        return False

    def _start(self, slot: _Slot) -> None:
        try:
            slot.child = self._spawn(slot.member)
        except OSError as exc:  # the executable is gone, no memory: as a crash at once
            log.error("fleet: %s could not start: %s", slot.member.name, exc)
            slot.child = None
            self._exited(slot, -1, self._clock())
            return
        slot.status.pid = slot.child.pid
        slot.status.state = "running"
        slot.status.started_at = self._wall()
        log.info("fleet: %s started, pid %d", slot.member.name, slot.child.pid)

    def _exited(self, slot: _Slot, code: int, now: float) -> None:
        slot.child = None
        slot.status.last_exit = code
        if code == InstanceIdHeld.EXIT_CODE:
            self._held(slot, now)
            return
        if code == LayoutNewer.EXIT_CODE:
            # The state moved to a layout this release does not speak: starting it again
            # would only stop again. The fleet stops; a release that speaks it must run.
            slot.status.state = "failed"
            log.error(
                "fleet: %s exited with %d: the state is in a newer layout than this release "
                "speaks (its log names both); stopping the fleet",
                slot.member.name,
                code,
            )
            self.status.state = "failed"
            return
        slot.held_since = None
        slot.recent = [t for t in slot.recent if now - t < self.policy.window_s]
        if len(slot.recent) >= self.policy.max_restarts:
            slot.status.state = "failed"
            log.error(
                "fleet: %s exited with %d and restarted %d times within %.0f s: giving up, "
                "stopping the fleet",
                slot.member.name,
                code,
                len(slot.recent),
                self.policy.window_s,
            )
            self.status.state = "failed"
            return
        slot.recent.append(now)
        wait = self.policy.wait_s(len(slot.recent))
        slot.start_at = now + wait
        slot.status.state = "backoff"
        log.warning(
            "fleet: %s exited with %d; restart %d of at most %d within %.0f s in %.1f s",
            slot.member.name,
            code,
            len(slot.recent),
            self.policy.max_restarts,
            self.policy.window_s,
            wait,
        )

    def _held(self, slot: _Slot, now: float) -> None:
        """The member's static id is still its killed predecessor's (KIP-848): not a crash,
        a wait; until fleet_instance_held_max_s has passed in a row."""
        if slot.held_since is None:
            slot.held_since = now
        if now - slot.held_since > self.policy.held_max_s:
            slot.status.state = "failed"
            self.status.state = "failed"
            log.error(
                "fleet: %s: its group.instance.id has stayed held for %.0f s "
                "(fleet_instance_held_max_s): another process of the same id? giving up, "
                "stopping the fleet",
                slot.member.name,
                now - slot.held_since,
            )
            return
        slot.start_at = now + self.policy.held_wait_s
        slot.status.state = "held"
        log.warning(
            "fleet: %s: its group.instance.id is still held by its previous process until that "
            "one's session expires; starting again in %.0f s",
            slot.member.name,
            self.policy.held_wait_s,
        )

    # -- the stop -----------------------------------------------------------------------------------
    def stop_all(self) -> list[str]:
        """SIGTERM to every running member, in the reverse of the start order; wait up to
        ``fleet_stop_timeout_s`` for all; kill the rest. The names of those killed."""
        if self.status.state != "failed":
            self.status.state = "stopping"
        running = [s for s in reversed(self.slots) if s.child is not None]
        for slot in running:
            assert slot.child is not None
            slot.status.state = "stopping"
            with contextlib.suppress(ProcessLookupError):  # it exited just now
                slot.child.send_signal(signal.SIGTERM)
        for slot in self.slots:
            if slot.child is None and slot.status.state in ("backoff", "held"):
                slot.status.state = "stopped"
        self._publish(force=True)
        deadline = self._clock() + self.stop_timeout_s
        while self._clock() < deadline and any(s.child.poll() is None for s in running if s.child):
            self._sleep(0.05)
        killed = []
        for slot in running:
            assert slot.child is not None
            code = slot.child.poll()
            if code is None:
                killed.append(slot.member.name)
                slot.child.kill()
                code = -signal.SIGKILL
            slot.status.last_exit = code
            slot.status.state = "stopped"
            slot.child = None
        if killed:
            log.error(
                "fleet: %s did not stop within %.0f s (fleet_stop_timeout_s): killed",
                ", ".join(killed),
                self.stop_timeout_s,
            )
        if self.status.state != "failed":
            self.status.state = "stopped"
        self._publish(force=True)
        return killed

    def _publish(self, *, force: bool = False) -> None:
        now = self._clock()
        if self._status_file is None or (not force and now - self._written < STATUS_INTERVAL_S):
            return
        self.status.updated_at = self._wall()
        write_status(self._status_file, self.status)
        self._written = now


# -- what the broker says of the members ------------------------------------------------------------
@dataclass(frozen=True)
class Assignment:
    """A subscription member's partitions as its group's coordinator has them, and their lag."""

    partitions: list[str]  # "topic[partition]"
    lag: int


def assignments(settings: Settings, status: FleetStatus) -> dict[str, Assignment]:
    """Each subscription member's partitions and their lag, from its group's description (a
    member's Kafka client.id carries its name: ``process_name``) and the group's lag."""
    base = settings.kafka_config()
    admin = admin_client(base)
    timeout = settings.connect_timeout_s
    slugs = sorted({m.subscription for m in status.members if m.subscription})
    groups = [group_id(slug, settings.env) for slug in slugs]
    out: dict[str, Assignment] = {}
    if not groups:
        return out
    described = admin.describe_consumer_groups(groups, request_timeout=timeout)
    prefix = f"rhumbatron-{settings.env}-"  # Settings.kafka_config's client.id
    for group in groups:
        description = described[group].result()
        lag = {
            (p.topic, p.partition): p.lag
            for p in group_lag(admin, base, group_reads(settings.topology, group), timeout)
        }
        for member in description.members:
            name = member.client_id.removeprefix(prefix)
            owned = sorted(
                (tp.topic, tp.partition) for tp in member.assignment.topic_partitions or []
            )
            out[name] = Assignment(
                [f"{t}[{p}]" for t, p in owned], sum(lag.get(tp, 0) for tp in owned)
            )
    return out


def current(settings: Settings) -> tuple[FleetStatus | None, dict[str, Assignment]]:
    """The fleet of ``settings.env`` on this host as its status file has it (``gone`` when its
    supervisor died without writing a last status), and its subscription members' partitions
    and lag while it runs. None: no fleet of the environment has run here."""
    found = read_status(status_path(settings))
    if found is None:
        return None, {}
    if found.state in ("running", "stopping") and not alive(found.pid):
        found.state = "gone"
    owned = assignments(settings, found) if found.state in ("running", "stopping") else {}
    return found, owned
