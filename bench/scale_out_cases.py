"""Scale-out: the project-view-projector as one process and as two of the same consumer group, over
the run's shared workload, each a real process of its own as the fleet runs it, and the CPU that
explains the ratio.

Two pairs of runs. Unpinned (``projector-1p``, ``projector-2p``): everything shares this machine's
cores, the broker and Redis included; that is the ratio a fleet on this machine gets. Pinned
(``projector-1p-pinned``, ``projector-2p-pinned``): the broker and every Redis thread on CPU 0,
the projector processes on CPU 1 (``taskset``; the broker's and Redis's own masks are put back
afterwards). Pinned, two processes share one core: if their rate stays that of one, the
projector is bound by its own CPU, not by the broker or Redis.

From the pinned one-process run, per event it handled: the projector process's user and system
CPU from its start to its last event (``projector-1p-pinned-cpu-us``), and the broker's and
Redis's over the same run (``-broker-cpu-us``, ``-redis-cpu-us``, from ``/proc/PID/stat``).
``projector-core-rate`` is 1 s over the first: the rate one projector process reaches per core
once the broker and Redis are elsewhere. The broker and Redis are found by infra/local.sh's pid
files; when they are not there (a bench against servers elsewhere), the pinned runs and the
servers' CPU are left out, said in the unpinned rows' notes.

A rate is timed from the first event any of the processes handled to the last: the steady rate of
the group, its first join left out (the other subscription rows count theirs), the rebalance when
the second process joins the first counted in.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import orjson

from bench.harness import BenchEnv, case, own_cpu_s, process_cpu_s, servers
from bench.latency_cases import settings_environ
from bench.rows import Row, rate
from bench.runtime_cases import forget_subscription, fresh_subscription
from router.settings import Settings
from router.wiring import collector
from router.wiring.subscription import open_subscription

ROOT = Path(__file__).resolve().parents[1]
SLUG = "project-view-projector"
IDLE_S = 3.0  # a process exits once it has had nothing for this long
SERVER_CPU, PROJECTOR_CPU = 0, 1  # the pinned runs' cores


@dataclass(frozen=True)
class Ran:
    """What one projector process reports: its counts, when it handled its first and its last
    event (wall clock), and its CPU seconds from its start to its last event."""

    records: int
    applied: int
    first_at: float | None  # None: it handled none (the other took every partition first)
    last_at: float | None
    cpu_s: float


@dataclass(frozen=True)
class Run:
    """One run of ``processes`` projector processes: theirs, and the servers' CPU seconds."""

    ran: list[Ran]
    broker_cpu_s: float | None
    redis_cpu_s: float | None

    @property
    def records(self) -> int:
        return sum(r.records for r in self.ran)

    @property
    def seconds(self) -> float:
        return max(r.last_at or 0.0 for r in self.ran) - min(
            r.first_at for r in self.ran if r.first_at is not None
        )


def child() -> None:
    """One projector process (settings from RHUMBATRON_*): runs until idle, prints a Ran."""
    settings = Settings()
    collector.tune(settings)  # as the bench's own children and every long-running command
    cpu_at_open = own_cpu_s()
    subscription = open_subscription(settings, SLUG)
    runner = subscription.runner
    first: list[float] = []
    last = {"records": 0, "at": 0.0, "cpu": cpu_at_open}

    def should_stop() -> bool:
        if runner.stats.records != last["records"]:
            now = time.time()
            first[:] = first or [now]
            last.update(records=runner.stats.records, at=now, cpu=own_cpu_s())
        return False

    try:
        runner.run(until_idle_s=IDLE_S, should_stop=should_stop, tick=subscription.tick)
    finally:
        subscription.close()
    stats = runner.stats
    first_at, last_at = (first[0], last["at"]) if first else (None, None)
    ran = Ran(stats.records, stats.applied, first_at, last_at, last["cpu"] - cpu_at_open)
    print(orjson.dumps(ran.__dict__).decode(), flush=True)


# -- pinning to cores ----------------------------------------------------------------------------


def _cores(cores: set[int]) -> str:
    return ",".join(map(str, sorted(cores)))


@contextmanager
def pinned(pids: list[int], core: int) -> Iterator[None]:
    """Every thread of each process on ``core`` (``taskset -a``; threads they start later inherit
    it), and each process's mask of before back afterwards."""
    before = {pid: os.sched_getaffinity(pid) for pid in pids}
    try:
        for pid in pids:
            _taskset(pid, {core})
        yield
    finally:
        for pid, cores in before.items():
            _taskset(pid, cores)


def _taskset(pid: int, cores: set[int]) -> None:
    subprocess.run(
        ["taskset", "-a", "-p", "-c", _cores(cores), str(pid)], check=True, capture_output=True
    )


# -- a run -----------------------------------------------------------------------------------------


def run(env: BenchEnv, processes: int, *, pin: dict[str, int] | None = None) -> Run:
    """``processes`` projector processes over the shared workload (its state of before deleted),
    pinned when ``pin`` gives the servers; until they have handled all of it."""
    s = env.settings
    forget_subscription(s, SLUG)
    found = pin or servers()
    cpu_before = {name: process_cpu_s(pid) for name, pid in (found or {}).items()}

    on_core = ["taskset", "-c", str(PROJECTOR_CPU)] if pin else []
    with pinned(list(pin.values()), SERVER_CPU) if pin else _nothing():
        children = [
            subprocess.Popen(
                [*on_core, sys.executable, "-m", "bench.scale_out_cases"],
                cwd=ROOT,
                env=settings_environ(s),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(processes)
        ]
        ran = [_report(p) for p in children]
        cpu_after = {name: process_cpu_s(pid) for name, pid in (found or {}).items()}
    result = Run(
        ran,
        cpu_after["broker"] - cpu_before["broker"] if found else None,
        cpu_after["redis"] - cpu_before["redis"] if found else None,
    )
    if result.records < env.size:
        raise RuntimeError(
            f"{processes} projector process(es) handled {result.records} of {env.size}"
        )
    return result


@contextmanager
def _nothing() -> Iterator[None]:
    yield


def _report(proc: subprocess.Popen[str]) -> Ran:
    out, err = proc.communicate(timeout=3600)
    if proc.returncode != 0:
        raise RuntimeError(f"a projector process exited {proc.returncode}: {err.strip()[-2000:]}")
    return Ran(**orjson.loads(out.strip().splitlines()[-1]))


def _split(r: Run) -> str:
    return " + ".join(f"{x.records} events in {x.cpu_s:.1f} CPU s" for x in r.ran)


def _servers_cpu(r: Run) -> str:
    if r.broker_cpu_s is None or r.redis_cpu_s is None:
        return "broker and Redis not found by infra/local.sh's pid files: their CPU not measured"
    return f"broker {r.broker_cpu_s:.1f} CPU s, Redis {r.redis_cpu_s:.1f} CPU s"


@case("scale-out", setup=lambda env: fresh_subscription(env, SLUG))
def scale_out(env: BenchEnv) -> list[Row]:
    """Rows projector-1p, projector-2p (its ratio vs 1p), and when the servers are found, the
    pinned pair and the CPU per event of the projector, the broker and Redis."""
    try:
        one, two = run(env, 1), run(env, 2)
        rows = [
            rate(
                "projector-1p",
                one.records,
                one.seconds,
                "events/s",
                vs="raw-consume",
                note=f"1 process, unpinned: {_split(one)}; {_servers_cpu(one)}",
            ),
            rate(
                "projector-2p",
                two.records,
                two.seconds,
                "events/s",
                vs="projector-1p",
                note=f"2 processes, unpinned: {_split(two)}; {_servers_cpu(two)}",
            ),
        ]
        pids = servers()
        if pids is None or (os.cpu_count() or 1) < 2:
            return rows
        one_p, two_p = run(env, 1, pin=pids), run(env, 2, pin=pids)
    finally:
        forget_subscription(env.settings, SLUG)
    where = f"broker and Redis on CPU {SERVER_CPU}, projectors on CPU {PROJECTOR_CPU}"
    assert one_p.broker_cpu_s is not None and one_p.redis_cpu_s is not None
    [alone] = one_p.ran
    us = 1e6 / alone.records
    return [
        *rows,
        rate(
            "projector-1p-pinned",
            one_p.records,
            one_p.seconds,
            "events/s",
            vs="projector-1p",
            note=f"1 process; {where}: {_split(one_p)}; {_servers_cpu(one_p)}",
        ),
        rate(
            "projector-2p-pinned",
            two_p.records,
            two_p.seconds,
            "events/s",
            vs="projector-1p-pinned",
            note=f"2 processes on one core; {where}: {_split(two_p)}; {_servers_cpu(two_p)}",
        ),
        Row(
            "projector-1p-pinned-cpu-us",
            alone.cpu_s * us,
            "us/event",
            note="CPU of the one pinned projector process per event it handled",
        ),
        Row(
            "projector-1p-pinned-broker-cpu-us",
            one_p.broker_cpu_s * us,
            "us/event",
            note="the broker's CPU over that run, per event",
        ),
        Row(
            "projector-1p-pinned-redis-cpu-us",
            one_p.redis_cpu_s * us,
            "us/event",
            note="Redis's CPU over that run, per event",
        ),
        Row(
            "projector-core-rate",
            1e6 / (alone.cpu_s * us),
            "events/s",
            note="1 CPU s over projector-1p-pinned-cpu-us: one projector process's rate per core "
            "with the broker and Redis on other machines",
        ),
    ]


if __name__ == "__main__":
    child()
