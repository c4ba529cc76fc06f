"""The benchmark harness: the case registry, the rounds (each case in a child process of its own,
interleaved), the median and spread of every row, the table and the JSON.

A case is ``fn(env) -> list[Row]`` registered with ``@case(name, setup=...)``; it times itself.
The parent runs ``python -m bench --child CASE ...`` once per case per round (round 1 of every
case, then round 2, ...), so a shared machine's load, which moves from minute to minute, falls on
every case alike, and each child's peak RSS is that case's own."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import re
import resource
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.rows import Row
from router.settings import Settings
from router.wiring import collector

ROOT = Path(__file__).resolve().parents[1]
FULL_SIZE = 500_000
QUICK_SIZE = 50_000
FAUST_EVENTS = 100_000  # events of a faust row at most: its rate is steady after seconds
DEFAULT_ROUNDS = 2
# A traceback's last line: "psycopg.errors.UndefinedTable: relation ...", "AssertionError".
EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?::|$)")
# The subscriptions' streams are spread over this many partitions (the product's default is the
# same order; four keeps one process busy on every poll).
PARTITIONS = 4
# How long the bench waits on the broker for metadata and new topics: a broker holding thousands
# of topics (a shared development one) takes tens of seconds to answer.
BROKER_TIMEOUT_S = 120.0


@dataclass
class BenchEnv:
    """What a case gets. ``settings``: the run's private environment (its topics and Redis keys
    carry the run's name); ``size``: events for a throughput row; ``scratch``: what its setup hands
    to the case; ``run_dir``: a folder of the run, the same for every child (to hand data across
    children of the run, e.g. a marker that the shared workload is published); ``round``: 1, 2, ..."""

    settings: Settings
    size: int
    quick: bool = False
    scratch: dict[str, Any] = field(default_factory=dict)
    run_dir: Path = field(default_factory=lambda: Path(tempfile.gettempdir()))
    round: int = 1


@dataclass(frozen=True)
class Case:
    name: str
    fn: Callable[[BenchEnv], list[Row]]
    setup: Callable[[BenchEnv], None] | None
    once: bool = False  # run in round 1 only: what it measures is not a rate (resident memory)
    # Run after the case, measured or failed (untimed): what it leaves behind removed, so the
    # cases after it find Redis as small as it was (the run's clean-up removes all at the end).
    teardown: Callable[[BenchEnv], None] | None = None
    # Its Rhumbatron processes are its children (started and waited for by the case), and the
    # case's own process only drives them (e2e: it plays the service writing the outbox and holds
    # the workload's drafts): its peak RSS is theirs, the largest of them (RUSAGE_CHILDREN).
    children: bool = False


CASES: dict[str, Case] = {}


def own_streams(env: BenchEnv, suffix: str) -> Settings:
    """The case's environment becomes one of its own under the run's (``<run>_<suffix>``, which
    the run's clean-up finds by name), with its streams provisioned."""
    from streams.admin import admin_client, provision

    s = env.settings = Settings(
        **{**env.settings.model_dump(), "env": f"{env.settings.env}_{suffix}"}
    )
    base = s.kafka_config()
    provision(
        admin_client(base),
        base,
        s.topology.stream_specs(),
        topology=s.topology,
        timeout=s.connect_timeout_s,
    )
    return s


# Modules whose import registers cases, in the order the cases run within a round.
CASE_MODULES = (
    "bench.cases",
    "bench.outbox_cases",
    "bench.pump_cases",
    "bench.runtime_cases",
    "bench.projector_cases",
    "bench.router_cases",
    "bench.archive_cases",
    "bench.analytics_cases",
    "bench.sql_cases",
    "bench.worker_cases",
    "bench.faust_cases",
    "bench.latency_cases",
    "bench.scale_cases",
    "bench.scale_out_cases",
    "bench.claim_cases",
)

# The table's order (and a round's: its cases run in the order of their names here; see order_key
# for a row not named here).
ROW_ORDER = (
    "raw-produce",
    "raw-produce-broker-cpu-us",
    "raw-consume",
    "publisher",
    "publisher-postgres",
    "pump",
    "ledger",
    "projector",
    "causal-router",
    "archiver",
    "analytics",
    "sql-effects",
    "raw-consume-queue",
    "worker",
    "worker-flaky",
    "worker-io",
    "faust-agent",
    "e2e-p50-ms",
    "e2e-p99-ms",
    "e2e-p999-ms",
    "claim-bytes",
    "claim-memory-1m",
    "claim-bytes-per-project",
    "rss-mb",
    "scale-projects",
)


# Rows made of two others of the same run: the first's value over the second's, round by round
# (their median is the row; absent unless both ran).
DERIVED = {"scale-projects": ("scale-100k", "projector")}

# Cases that measure someone else's code (raw-produce holds every encoded record in memory, on
# purpose: the client alone is timed): their peak RSS is shown on their rows but is not rss-mb.
OTHERS = ("raw-", "faust-")


def load_cases(*, only: str | None = None) -> None:
    """Import the case modules (their import registers their cases); ``only``: that one alone,
    as a child does, so a case's peak RSS holds no other case's imports (faust's, the PostgreSQL
    driver's): what it measures is its own process, as a deployment runs it."""
    import importlib

    for name in CASE_MODULES if only is None else (only,):
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise


def case(
    name: str,
    *,
    setup: Callable[[BenchEnv], None] | None = None,
    once: bool = False,
    teardown: Callable[[BenchEnv], None] | None = None,
    children: bool = False,
) -> Callable[[Callable[[BenchEnv], list[Row]]], Callable[[BenchEnv], list[Row]]]:
    def register(fn: Callable[[BenchEnv], list[Row]]) -> Callable[[BenchEnv], list[Row]]:
        CASES[name] = Case(name, fn, setup, once, teardown, children)
        return fn

    return register


# -- CPU: this process's, and the broker's and Redis's -------------------------------------------
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def own_cpu_s() -> float:
    """User and system seconds of this process, all its threads."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def process_cpu_s(pid: int) -> float:
    """User and system seconds of a process, all its threads (``/proc/PID/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime


def _server_pid(relative: str) -> int | None:
    """A server's pid from infra/local.sh's pid file, if that process is alive."""
    state = Path(os.environ.get("RHUMBATRON_LOCAL_DIR", ROOT / ".local"))
    try:
        pid = int((state / relative).read_text().strip())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return None
    return pid


def servers() -> dict[str, int] | None:
    """The pids of infra/local.sh's single broker and Redis (``broker``, ``redis``), or None
    when either is not running from there (a bench against servers elsewhere)."""
    broker, redis = _server_pid("kafka/single/kafka.pid"), _server_pid("redis/redis.pid")
    if broker is None or redis is None:
        return None
    return {"broker": broker, "redis": redis}


@dataclass(frozen=True)
class CpuUse:
    """CPU seconds over a stretch: this process's, and the servers' (None: not found)."""

    own_s: float
    broker_s: float | None
    redis_s: float | None


class CpuMeter:
    """``with CpuMeter() as meter: ...``, then ``meter.use``: the CPU the stretch took."""

    def __enter__(self) -> CpuMeter:
        self._pids = servers() or {}
        self._own = own_cpu_s()
        self._servers = {name: process_cpu_s(pid) for name, pid in self._pids.items()}
        return self

    def __exit__(self, *exc: object) -> None:
        after = {name: process_cpu_s(pid) for name, pid in self._pids.items()}
        spent = {name: after[name] - self._servers[name] for name in after}
        self.use = CpuUse(own_cpu_s() - self._own, spent.get("broker"), spent.get("redis"))


def cpu_row(name: str, use: CpuUse, events: int, what: str = "events") -> Row:
    """``<name>-cpu-us``: the process's CPU per event (or row) it handled, with the broker's and
    Redis's over the same stretch in the note: the sizing arithmetic's figures
    (docs/operations.md)."""
    per = 1e6 / max(events, 1)
    servers_note = (
        f"; broker {use.broker_s * per:.1f} us, Redis {use.redis_s * per:.1f} us per {what[:-1]}"
        if use.broker_s is not None and use.redis_s is not None
        else "; the broker's and Redis's CPU not measured (not infra/local.sh's)"
    )
    return Row(
        f"{name}-cpu-us",
        use.own_s * per,
        f"us/{what[:-1]}",
        note=f"user and system CPU of the process over its {events} {what}{servers_note}",
    )


# -- the child side --------------------------------------------------------------------------------
def run_one(
    name: str,
    env_name: str,
    size: int,
    *,
    quick: bool,
    run_dir: Path,
    round_no: int,
    module: str | None = None,
) -> dict[str, Any]:
    """Run one case in this process and return what it measured and this process's peak RSS.
    ``module``: the one that registers the case (else every case module is imported)."""
    load_cases(only=module)
    settings = Settings(env=env_name, partitions=PARTITIONS, connect_timeout_s=BROKER_TIMEOUT_S)
    collector.tune(settings)  # as every long-running command is (router/cli/observed.py)
    env = BenchEnv(settings=settings, size=size, quick=quick, run_dir=run_dir, round=round_no)
    spec = CASES[name]
    try:
        if spec.setup is not None:
            spec.setup(env)
        rows = spec.fn(env)
        who = resource.RUSAGE_CHILDREN if spec.children else resource.RUSAGE_SELF
        rss_kb = resource.getrusage(who).ru_maxrss  # KiB on Linux
    finally:
        if spec.teardown is not None:
            spec.teardown(env)
    return {
        "case": name,
        "round": round_no,
        "rows": [dataclasses.asdict(r) for r in rows],
        "rss_mb": rss_kb / 1024,
    }


# -- rounds, median, spread, ratio -----------------------------------------------------------------
def order_key(name: str) -> tuple[int, int]:
    """Where a row goes in the table: its place in ROW_ORDER; a row not named there goes after
    the last named row of its group (the first part of its name: "e2e-5k-p99-ms" after
    "e2e-p999-ms"), else at the end."""
    if name in ROW_ORDER:
        return (ROW_ORDER.index(name), 0)
    group = name.split("-", maxsplit=1)[0]
    at = len(ROW_ORDER)
    for index, known in enumerate(ROW_ORDER):
        if known.split("-")[0] == group:
            at = index
    return (at, 1)


def spread_pct(values: Sequence[float]) -> float | None:
    """Half the range of the rounds' values as a percentage of their median: ±spread %. None
    for one round (no spread to tell) or a median of 0."""
    median = statistics.median(values)
    if len(values) < 2 or median == 0:
        return None
    return (max(values) - min(values)) / 2 / abs(median) * 100


def aggregate(results: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per row name over every round: its median, its spread, its ratio to the median of
    its ``vs`` row, the largest peak RSS of its case's processes; a FAILED row per failed case
    (its error's last line); then ``rss-mb``, the largest peak RSS of any case. Sorted by
    ROW_ORDER."""
    values: dict[str, list[float]] = {}
    first: dict[str, dict[str, Any]] = {}
    rss: dict[str, float] = {}
    failed: dict[str, dict[str, Any]] = {}
    case_rss: dict[str, float] = {}
    by_round: dict[str, dict[int, float]] = {}
    for result in results:
        name = result["case"]
        if "error" in result:
            failed.setdefault(name, result)
            continue
        case_rss[name] = max(case_rss.get(name, 0.0), result["rss_mb"])
        for row in result["rows"]:
            values.setdefault(row["name"], []).append(float(row["value"]))
            by_round.setdefault(row["name"], {})[result["round"]] = float(row["value"])
            first.setdefault(row["name"], {**row, "case": name})
            rss[row["name"]] = max(rss.get(row["name"], 0.0), result["rss_mb"])
    medians = {name: statistics.median(v) for name, v in values.items()}
    for name, (over, under) in DERIVED.items():
        tops, bottoms = by_round.get(over, {}), by_round.get(under, {})
        per_round = [tops[r] / bottoms[r] for r in sorted(tops) if bottoms.get(r)]
        if per_round:
            values[name] = per_round
            medians[name] = statistics.median(per_round)
            first[name] = {
                "name": name,
                "unit": "x",
                "note": f"{over} / {under}, round by round",
                "case": first[over]["case"],
            }
            rss[name] = rss[over]
    out: list[dict[str, Any]] = []
    for name, rounds in values.items():
        row = first[name]
        vs = row.get("vs")
        base = medians.get(vs) if vs else None
        out.append(
            {
                "name": name,
                "value": medians[name],
                "unit": row["unit"],
                "vs": vs,
                "ratio": medians[name] / base if base else None,
                "spread": spread_pct(rounds),
                "rounds": rounds,
                "rss_mb": rss[name],
                "note": row.get("note", ""),
            }
        )
    for name, result in failed.items():
        error = f"FAILED (round {result['round']}): {result['error']}"
        partial = [r for r in out if r["name"] in first and first[r["name"]]["case"] == name]
        for row in partial:  # failed in some rounds only: the others' median, and the error
            row["note"] = f"{row['note']}; {error}" if row["note"] else error
            row["error"] = result["error"]
        if partial:
            continue
        out.append(
            {
                "name": name,
                "value": None,
                "unit": "",
                "vs": None,
                "ratio": None,
                "spread": None,
                "rss_mb": None,
                "note": error,
                "error": result["error"],
                "failed": True,
            }
        )
    ours = {n: mb for n, mb in case_rss.items() if not n.startswith(OTHERS)}
    if ours:
        largest = max(ours, key=lambda n: ours[n])
        out.append(
            {
                "name": "rss-mb",
                "value": case_rss[largest],
                "unit": "MB",
                "vs": None,
                "ratio": None,
                "spread": None,
                "rss_mb": case_rss[largest],
                "note": f"the largest peak RSS of a Rhumbatron process: {largest}",
            }
        )
    order = {name: n for n, name in enumerate(r["name"] for r in out)}
    return sorted(out, key=lambda r: (order_key(r["name"]), order[r["name"]]))


def report(machine: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {"machine": machine, "rows": rows}


def _figure(value: float | None) -> str:
    if value is None:
        return "-"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def table(rows: list[dict[str, Any]]) -> str:
    header = ("row", "value", "unit", "vs", "ratio", "spread", "peak RSS MB", "note")
    lines = [
        (
            r["name"],
            "FAILED" if r.get("failed") else _figure(r["value"]),
            r["unit"],
            r["vs"] or "-",
            f"{r['ratio']:.2f}x" if r["ratio"] is not None else "-",
            f"±{r['spread']:.1f}%" if r["spread"] is not None else "-",
            f"{r['rss_mb']:.0f}" if r.get("rss_mb") is not None else "-",
            r.get("note", ""),
        )
        for r in rows
    ]
    widths = [max(len(line[i]) for line in [header, *lines]) for i in range(len(header) - 1)]
    right = {1, 4, 5, 6}

    def fmt(line: tuple[str, ...]) -> str:
        cells = [
            cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])
            for i, cell in enumerate(line[:-1])
        ]
        return "  ".join([*cells, line[-1]]).rstrip()

    return "\n".join([fmt(header), *(fmt(line) for line in lines)])


# -- the machine -----------------------------------------------------------------------------------
def machine_info(settings: Settings) -> dict[str, Any]:
    """What the figures were measured on. A service that does not answer is named as such."""
    import confluent_kafka

    info: dict[str, Any] = {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "memory_gb": _memory_gb(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "confluent_kafka": confluent_kafka.__version__,
        "librdkafka": confluent_kafka.libversion()[0],
        "kafka": _kafka_version(),
        "redis": None,
        "postgresql": None,
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    try:
        from consumers.redis_conn import connect

        info["redis"] = connect(settings.redis_url, timeout=5).info("server")["redis_version"]
    except Exception as exc:
        info["redis"] = f"unreachable: {exc}"
    try:
        import psycopg

        from bench.outbox_cases import postgres_url

        with psycopg.connect(postgres_url(), connect_timeout=5) as conn:
            row = conn.execute("SHOW server_version").fetchone()
            info["postgresql"] = row[0] if row else None
    except Exception as exc:
        info["postgresql"] = f"unreachable: {exc}"
    return info


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_gb() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    return None


def _kafka_version() -> str | None:
    """The local broker's release, as infra/kafka/pom.xml pins it (the Kafka protocol does not
    tell a client the broker's release)."""
    try:
        text = (ROOT / "infra" / "kafka" / "pom.xml").read_text()
    except OSError:
        return None
    found = re.search(r"<kafka\.version>([^<]+)</kafka\.version>", text)
    return found.group(1) if found else None


# -- the parent side -------------------------------------------------------------------------------
class Progress:
    """Which case of which round runs, and for how long: a live ``rich`` display on a terminal's
    stderr, one plain line per case otherwise."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.live = sys.stderr.isatty()
        self.started = time.monotonic()
        self._rich: Any = None
        self._task: Any = None

    def __enter__(self) -> Progress:
        if self.live:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                TextColumn,
                TimeElapsedColumn,
            )
            from rich.progress import Progress as RichProgress

            self._rich = RichProgress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=Console(stderr=True),
            )
            self._rich.__enter__()
            self._task = self._rich.add_task("starting", total=self.total)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._rich is not None:
            self._rich.__exit__(None, None, None)

    def say(self, text: str) -> None:
        if self._rich is not None:
            self._rich.console.print(text)
        else:
            print(text, file=sys.stderr, flush=True)

    def begin(self, name: str, round_no: int, rounds: int) -> None:
        if self._rich is not None:
            self._rich.update(self._task, description=f"round {round_no}/{rounds} {name}")
        else:
            self.say(f"round {round_no}/{rounds} {name} ...")

    def end(self, name: str, round_no: int, rounds: int, seconds: float, outcome: str) -> None:
        total = time.monotonic() - self.started
        line = (
            f"round {round_no}/{rounds} {name}: {outcome} in {seconds:.1f} s ({total:.0f} s so far)"
        )
        if self._rich is not None:
            self._rich.advance(self._task)
        self.say(line)


def child_environment() -> dict[str, str]:
    """The children's environment: the caller's, without any OTEL_* variable (telemetry is off
    for every measured row; the product starts an SDK only through its command line, and the
    bench never does)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}


def run_child(
    name: str, env_name: str, size: int, *, quick: bool, run_dir: Path, round_no: int
) -> dict[str, Any]:
    command = [
        sys.executable,
        "-m",
        "bench",
        "--child",
        name,
        "--env",
        env_name,
        "--size",
        str(size),
        "--round",
        str(round_no),
        "--run-dir",
        str(run_dir),
        "--module",
        CASES[name].fn.__module__,
    ]
    if quick:
        command.append("--quick")
    proc = subprocess.run(
        command, cwd=ROOT, env=child_environment(), capture_output=True, text=True, check=False
    )
    if proc.returncode == 0:
        try:
            result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
            return result
        except (IndexError, ValueError):
            pass
    return {"case": name, "round": round_no, "error": last_error(proc)}


def last_error(proc: subprocess.CompletedProcess[str]) -> str:
    """The line of a child's output that names its error: the last one that starts with an
    exception's name (an error's message may go on over lines of its own), else its last line."""
    lines = (proc.stderr or proc.stdout).strip().splitlines()
    named = [line for line in lines if EXCEPTION_LINE.match(line)]
    if named:
        return named[-1]
    return lines[-1] if lines else f"exit code {proc.returncode}, no output"


class Interrupted(Exception):
    """Ctrl-C during a run: what was measured before it, to print all the same."""

    def __init__(self, results: list[dict[str, Any]]) -> None:
        super().__init__("interrupted")
        self.results = results


def run_all(names: list[str], *, rounds: int, size: int, quick: bool) -> list[dict[str, Any]]:
    """Every case once per round, interleaved; the run's topics, groups, Redis keys and folder
    are removed at the end, also when a case fails or the run is interrupted (Interrupted,
    holding the case runs finished before)."""
    env_name = "bench" + secrets.token_hex(4)
    run_dir = Path(tempfile.mkdtemp(prefix=f"rh-{env_name}-"))
    results: list[dict[str, Any]] = []
    try:
        with Progress(planned_runs(names, rounds)) as progress:
            progress.say(
                f"bench run {env_name}: {len(names)} cases x {rounds} rounds, {size} events"
            )
            for round_no in range(1, rounds + 1):
                for name in names:
                    if CASES[name].once and round_no > 1:
                        continue
                    progress.begin(name, round_no, rounds)
                    started = time.monotonic()
                    result = run_child(
                        name, env_name, size, quick=quick, run_dir=run_dir, round_no=round_no
                    )
                    outcome = f"FAILED: {result['error']}" if "error" in result else "done"
                    progress.end(name, round_no, rounds, time.monotonic() - started, outcome)
                    results.append(result)
    except KeyboardInterrupt:
        raise Interrupted(results) from None
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
        # A second Ctrl-C must not stop the clean-up halfway.
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            remove_run(env_name)
        finally:
            signal.signal(signal.SIGINT, previous)
    return results


def planned_runs(names: Sequence[str], rounds: int) -> int:
    """How many case runs a run of ``rounds`` rounds makes (a ``once`` case runs in round 1 only)."""
    return sum(1 if CASES[n].once else rounds for n in names)


def delete_keys(client: Any, *patterns: str) -> int:
    """Delete every Redis key matching one of ``patterns``; how many there were. SCAN walks the
    whole keyspace once per pattern, so it asks for 10,000 keys a step: a run's Redis holds
    hundreds of thousands of keys by its end."""
    deleted = 0
    for pattern in patterns:
        keys = list(client.scan_iter(match=pattern, count=10_000))
        for start in range(0, len(keys), 10_000):
            client.unlink(*keys[start : start + 10_000])
        deleted += len(keys)
    return deleted


def remove_run(env_name: str) -> None:
    """Delete the run's topics, consumer groups, Redis keys and PostgreSQL schemas (every name a
    case makes carries the run's name), so repeated runs do not fill the local services. A
    service that does not answer is named with what is left on it; the others are cleaned."""
    removed = []
    for what, remove in (
        ("Kafka topics and groups", _remove_from_kafka),
        ("PostgreSQL schemas", _remove_from_postgres),
        ("Redis keys", _remove_from_redis),
    ):
        try:
            removed.append(remove(env_name))
        except Exception as exc:
            print(
                f"could not remove the run's {what} (names with {env_name}): {exc}", file=sys.stderr
            )
    print(f"removed the run's {', '.join(removed) or 'nothing'}", file=sys.stderr)


def _remove_from_kafka(env_name: str) -> str:
    from streams.admin import admin_client, delete_topics

    base = Settings(env=env_name).kafka_config()
    admin = admin_client(base)
    topics = [t for t in admin.list_topics(timeout=BROKER_TIMEOUT_S).topics if env_name in t]
    delete_topics(admin, base, topics, timeout=BROKER_TIMEOUT_S)
    groups = [
        g.group_id
        for g in admin.list_consumer_groups(request_timeout=30).result(timeout=60).valid
        if env_name in g.group_id
    ]
    for future in (
        admin.delete_consumer_groups(groups, request_timeout=15) if groups else {}
    ).values():
        try:
            future.result(timeout=20)
        except Exception as exc:  # a group still settling: say so, the topics are gone anyway
            print(f"could not delete a consumer group of the run: {exc}", file=sys.stderr)
    return f"{len(topics)} topics, {len(groups)} groups"


def _remove_from_postgres(env_name: str) -> str:
    from bench.outbox_cases import drop_run_schemas

    return f"{drop_run_schemas(env_name)} PostgreSQL schemas"


def _remove_from_redis(env_name: str) -> str:
    from consumers.redis_conn import connect

    client = connect(Settings(env=env_name).redis_url, timeout=5)
    return f"{delete_keys(client, f'*{env_name}*')} Redis keys"


# -- the command -----------------------------------------------------------------------------------
DESCRIPTION = (
    "Measure Rhumbatron beside the raw confluent-kafka client on the local services (Kafka, Redis, "
    "PostgreSQL), in one run, and print one table on stdout. Every case runs in a child process "
    "of its own, once per round, interleaved (round 1 of every case, then round 2, ...); a row "
    "is the median of its rounds, its spread is half the range of the rounds as a percentage of "
    "the median, its ratio is its median over the median of the row it is set beside (vs), "
    "measured in the same run, and peak RSS is the largest of its case's processes. Throughput "
    f"rows use {FULL_SIZE:,} events ({QUICK_SIZE:,} with --quick; the faust rows at most "
    f"{FAUST_EVENTS:,}); the workload is published once "
    "per run and read by raw-consume and every subscription with a fresh consumer group and "
    "fresh Redis state each round. Telemetry is off. The run's topics, groups and Redis keys are "
    "removed at the end, also when interrupted; a failed case shows as a FAILED row and the "
    "others go on. Progress goes to stderr. See docs/performance.md."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"{QUICK_SIZE:,} events per throughput row instead of {FULL_SIZE:,} (minutes, not "
        "most of an hour)",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help='print {"machine": {...}, "rows": [{"name", "value", "unit", "vs", "ratio", '
        '"spread", ...}]} instead of the table',
    )
    parser.add_argument(
        "--rounds",
        type=_rounds,
        default=DEFAULT_ROUNDS,
        metavar="N",
        help=f"run every case N times, interleaved (default {DEFAULT_ROUNDS}); each row is its "
        "median",
    )
    parser.add_argument(
        "cases",
        nargs="*",
        metavar="CASE",
        help="the cases to run (default: all), by the name of the row they measure, e.g. "
        "raw-consume projector; a case's baseline is not added for you",
    )
    # Undocumented: events per throughput row, for the bench's own tests.
    parser.add_argument("--size", type=_rounds, default=None, help=argparse.SUPPRESS)


def _rounds(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value}: at least 1")
    return value


class UnknownCase(ValueError):
    pass


def selected(names: Sequence[str]) -> list[str]:
    """The cases to run, in the table's order; an unknown name is refused naming the known ones."""
    load_cases()
    unknown = [n for n in names if n not in CASES]
    if unknown:
        raise UnknownCase(
            f"unknown case {', '.join(map(repr, unknown))}; the cases: {', '.join(CASES)}"
        )
    wanted = set(names)
    chosen = [n for n in CASES if not wanted or n in wanted]
    return sorted(chosen, key=order_key)  # a round runs in the table's order


def run_command(args: argparse.Namespace) -> int:
    names = selected(args.cases)
    size = args.size or (QUICK_SIZE if args.quick else FULL_SIZE)
    settings = Settings()
    machine = machine_info(settings)
    interrupted = False
    try:
        results = run_all(names, rounds=args.rounds, size=size, quick=args.quick)
    except Interrupted as stop:
        results, interrupted = stop.results, True
    rows = aggregate(results)
    done = f"{len(results)} of {planned_runs(names, args.rounds)} case runs"
    if args.json:
        shaped = report(machine, rows)
        if interrupted:
            shaped["interrupted"] = done
        print(json.dumps(shaped, indent=2))
    else:
        described = ", ".join(f"{k} {v}" for k, v in machine.items() if v is not None)
        print(f"machine: {described}")
        rounds = f"{args.rounds} round{'s' if args.rounds != 1 else ''}"
        print(f"{rounds}, {size:,} events per throughput row")
        if interrupted:
            print(f"interrupted after {done}: the medians of the rounds measured")
        print(table(rows))
    if interrupted:
        return 130
    return 1 if any("error" in r for r in rows) else 0
