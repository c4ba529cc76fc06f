"""The pipeline under test as real processes: ``rhumbatron publish`` on the row's outbox and one
``rhumbatron consume`` per subscription, each supervised as the fleet would supervise it — a
member that exits, for whatever reason, is started again after a short pause. Only the first
start of a member carries the fail-point a row arms in it, so a restart is the healed process.

Each start's output goes to its own log file (a pipe nobody reads would fill and block the
member), kept after the row for a reader of a failure.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from router.settings import Settings
from tests.chaos.matrix.scenarios import PUBLISHER, SUBSCRIPTIONS
from tests.support.environment import ROOT, subprocess_env

# A member that exits is started again after this long (the fleet's restart backoff, shortened:
# a row measures healing, and a server that is down makes a member exit at once on every start).
RESTART_PAUSE_S = 1.0
# SIGTERM asks a member to finish its batch and commit; past this it is killed.
STOP_TIMEOUT_S = 60.0


def publish_args(outbox: Path | str) -> list[str]:
    return [sys.executable, "-m", "router.cli", "-v", "publish", "--outbox", str(outbox)]


def consume_args(slug: str, *, until_idle: float | None = None) -> list[str]:
    args = [sys.executable, "-m", "router.cli", "-v", "consume", "--subscription", slug]
    return args + (["--until-idle", str(until_idle)] if until_idle is not None else [])


@dataclass
class Member:
    role: str
    args: list[str]
    env: dict[str, str]
    logs: Path
    armed: dict[str, str] = field(default_factory=dict)  # extra environment of the first start
    cwd: Path = ROOT  # another release's members run in its own checkout
    proc: subprocess.Popen[bytes] | None = None
    exits: list[int] = field(default_factory=list)  # each start's exit code, in order
    exited_at: float = 0.0

    @property
    def starts(self) -> int:
        return len(self.exits) + (1 if self.proc is not None else 0)

    def log(self, n: int) -> Path:
        return self.logs / f"{self.role}.{n}.log"

    def start(self) -> None:
        env = {**self.env, **(self.armed if not self.exits else {})}
        with self.log(len(self.exits)).open("wb") as out:
            self.proc = subprocess.Popen(
                self.args, cwd=self.cwd, env=env, stdout=out, stderr=subprocess.STDOUT
            )

    def supervise(self) -> None:
        """Record an exit; start again once the pause after it is over."""
        if self.proc is not None:
            code = self.proc.poll()
            if code is None:
                return
            self.exits.append(code)
            self.proc = None
            self.exited_at = time.monotonic()
        if time.monotonic() - self.exited_at >= RESTART_PAUSE_S:
            self.start()

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self.exits.append(code)
        self.proc = None

    def signal(self, sig: signal.Signals) -> None:
        if self.proc is not None:
            self.proc.send_signal(sig)


class Pipeline:
    """The publisher and one member per subscription, on ``s``'s environment."""

    def __init__(
        self,
        s: Settings,
        outbox: Path | str,
        logs: Path,
        armed: dict[str, dict[str, str]],
        more: dict[str, list[str]] | None = None,
        more_env: dict[str, str] | None = None,
    ) -> None:
        """``more``: more members (role: arguments), e.g. the command side; ``more_env``: more
        environment for every member."""
        logs.mkdir(parents=True, exist_ok=True)
        env = subprocess_env(s, **(more_env or {}))
        self.members = {
            PUBLISHER: Member(PUBLISHER, publish_args(outbox), env, logs),
            **{slug: Member(slug, consume_args(slug), env, logs) for slug in SUBSCRIPTIONS},
            **{role: Member(role, args, env, logs) for role, args in (more or {}).items()},
        }
        for role, extra in armed.items():
            self.members[role].armed = extra
        self.left: list[Member] = []  # members removed on the way, for their exit codes

    def start(self) -> None:
        for member in self.members.values():
            member.start()

    def add(
        self, name: str, like: str, *, args: list[str] | None = None, cwd: Path | None = None
    ) -> Member:
        """Start another member of ``like``'s group, unarmed, supervised from here on (``args``
        and ``cwd``: another release's command and checkout)."""
        model = self.members[like]
        member = Member(name, args or model.args, model.env, model.logs, cwd=cwd or model.cwd)
        self.members[name] = member
        member.start()
        return member

    def remove(self, name: str) -> None:
        """Stop a member started with :meth:`add` (SIGTERM: it leaves the group cleanly)."""
        member = self.members.pop(name)
        member.stop()
        self.left.append(member)

    def supervise(self) -> None:
        for member in self.members.values():
            member.supervise()

    def stop(self) -> None:
        for member in self.members.values():
            member.stop()

    def restarts(self) -> dict[str, list[int]]:
        """Each member's exit codes, its last the end's (0: it left cleanly)."""
        out = {role: m.exits for role, m in self.members.items()}
        for member in self.left:
            out[member.role] = member.exits
        return out


def drain(
    s: Settings,
    slug: str,
    logs: Path,
    *,
    until_idle: float,
    timeout: float,
    env: dict[str, str] | None = None,
) -> int:
    """One more ``consume --until-idle`` of ``slug`` after the pipeline stopped: it exits 0 only
    once nothing is paused for a retry, no effect is pending and every partition is read to its
    end. Its exit code (-9 if it did not get there within ``timeout``)."""
    with (logs / f"{slug}.drain.log").open("wb") as out:
        proc = subprocess.Popen(
            consume_args(slug, until_idle=until_idle),
            cwd=ROOT,
            env=subprocess_env(s, **(env or {})),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            return -signal.SIGKILL
