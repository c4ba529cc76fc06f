"""Row 23, a rolling upgrade (scenarios.RollingUpgrade): the previous release and this one in the
same consumer groups under load, then the previous stopped, a rollback to it, forward again, and
``rhumbatron state migrate --finalize``.

The previous release is CHANGELOG.md's entry before this one: its commit checked out in a git
worktree and installed into a venv of its own, under ``.local/releases/<version>-<commit>/``
(made once, reused after). Its venv gets this checkout's dependencies by a path line in a
``.pth`` file (a plain directory on ``sys.path``: the editable install of this checkout there is
not activated), so it runs its own code on the same libraries; its members run in its worktree.
"""

from __future__ import annotations

import re
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable
from pathlib import Path

import orjson

from consumers.runtime.layout import LAYOUT
from router.settings import Settings
from tests.chaos.matrix.pipeline import Pipeline
from tests.chaos.matrix.scenarios import SUBSCRIPTIONS, RollingUpgrade
from tests.support.environment import ROOT, run_cli, subprocess_env

RELEASES = ROOT / ".local" / "releases"
ENTRY = re.compile(r"^## (\d+\.\d+\.\d+)\n\n- Commit: (\S+)\n- State layout: speaks (\d+)", re.M)
LAYOUT_REFUSED = 78  # streams.errors.LayoutNewer.EXIT_CODE, as the previous release has it


def previous_release() -> tuple[str, str, int]:
    """(version, commit, layout spoken) of the release before this one, from CHANGELOG.md."""
    entries = ENTRY.findall((ROOT / "CHANGELOG.md").read_text())
    if len(entries) < 2:
        raise RuntimeError("CHANGELOG.md names no release before this one")
    version, commit, layout = entries[1]
    return version, commit, int(layout)


def install(version: str, commit: str) -> tuple[Path, Path]:
    """The release's (python, checkout), made once."""
    home = RELEASES / f"{version}-{commit}"
    src, venv = home / "src", home / "venv"
    python = venv / "bin" / "python"
    if (home / "installed").exists():
        return python, src
    home.mkdir(parents=True, exist_ok=True)
    if not src.exists():
        _run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "--force", str(src), commit])
    _run([sys.executable, "-m", "venv", "--clear", str(venv)])
    _run([str(python), "-m", "pip", "install", "-q", "--no-deps", str(src)])
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (Path(site) / "rhumbatron-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    said = subprocess.run(
        [str(python), "-m", "router.cli", "--version"],
        cwd=src,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    if not said.startswith(f"rhumbatron {version}"):
        raise RuntimeError(f"the release installed for {version} says {said!r}")
    (home / "installed").write_text(said)
    return python, src


def _run(args: list[str]) -> None:
    done = subprocess.run(args, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed: {done.stderr[-2000:]}")


def consume(python: Path, slug: str, *more: str) -> list[str]:
    return [str(python), "-m", "router.cli", "-v", "consume", "--subscription", slug, *more]


class UpgradeDrill:
    """Strikes (the previous release stopped) when due; ``rollback_s`` later it has rolled back
    and forward and finalized, and is healed."""

    def __init__(
        self,
        fault: RollingUpgrade,
        s: Settings,
        pipeline: Pipeline,
        due: Callable[[], bool],
        snapshot: Callable[[], dict[str, int]],
        logs: Path,
    ) -> None:
        self.fault = fault
        self.s = s
        self.pipeline = pipeline
        self.due = due
        self.snapshot = snapshot
        self.logs = logs
        self.version, self.commit, self.layout = previous_release()
        self.python, self.src = install(self.version, self.commit)
        self.struck_at: float | None = None
        self.healed_at: float | None = None
        self.at_strike: dict[str, int] = {}
        self.step = 0
        self.stepped_at = 0.0
        self.finalized: dict[str, object] | None = None
        self.finalize_error = ""
        self.refusal: tuple[int, str] | None = None  # the previous release once finalized

    def prepare(self) -> None:
        """Before the pipeline starts: its subscription members run the previous release, and a
        member of this one joins each group beside them."""
        for slug in SUBSCRIPTIONS:
            member = self.pipeline.members[slug]
            member.args, member.cwd = consume(self.python, slug), self.src

    def _join(self, suffix: str, like: str, python: Path, cwd: Path) -> None:
        for slug in SUBSCRIPTIONS:
            args = consume(python, slug)
            self.pipeline.add(f"{slug}{suffix}", f"{slug}{like}", args=args, cwd=cwd)

    def _leave(self, suffix: str) -> None:
        for slug in SUBSCRIPTIONS:
            self.pipeline.remove(f"{slug}{suffix}")

    def _assigned(self, suffix: str) -> bool:
        """Whether each of these members took partitions (a member stopped while it starts dies
        by the signal, before its handler is in place: each step waits for the joiners)."""
        return all(
            "assigned "
            in self.pipeline.members[f"{slug}{suffix}"].log(0).read_text(errors="replace")
            for slug in SUBSCRIPTIONS
        )

    def poll(self) -> None:
        now = time.monotonic()
        half = self.fault.rollback_s / 2
        this, previous = Path(sys.executable), self.python
        if self.step == 0:  # this release joins the previous one's groups
            self._join("-next", "", this, ROOT)
            self.step = 1
        elif self.step == 1 and self.due() and self._assigned("-next"):
            self.at_strike = self.snapshot()
            self._leave("")  # the previous release leaves: this one owns everything
            self.struck_at = now
            self.step, self.stepped_at = 2, now
        elif self.step == 2 and now - self.stepped_at >= half:
            self._join("-back", "-next", previous, self.src)  # a rollback
            self.step = 3
        elif self.step == 3 and self._assigned("-back"):
            self._leave("-next")
            self.step, self.stepped_at = 4, now
        elif self.step == 4 and now - self.stepped_at >= half:
            self._join("-again", "-back", this, ROOT)  # forward again
            self.step = 5
        elif self.step == 5 and self._assigned("-again"):
            self._leave("-back")
            self._finalize()
            self._probe()
            self.healed_at = time.monotonic()
            self.step = 6

    def _finalize(self) -> None:
        done = run_cli(self.s, "state", "migrate", "--finalize", "--json")
        if done.returncode != 0:
            self.finalize_error = done.stderr[-1000:]
            return
        self.finalized = orjson.loads(done.stdout)

    def _probe(self) -> None:
        """The previous release started once more, after the finalize."""
        log = self.logs / "previous-release-after-finalize.log"
        with log.open("wb") as out:
            proc = subprocess.run(
                consume(self.python, SUBSCRIPTIONS[0], "--until-idle", "5"),
                cwd=self.src,
                env=subprocess_env(self.s),
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=120,
            )
        self.refusal = (proc.returncode, log.read_text(errors="replace"))

    def problems(self) -> list[str]:
        if self.healed_at is None:
            return [f"the upgrade never got past step {self.step} of 6"]
        found: list[str] = []
        if self.finalized is None:
            found.append(f"state migrate --finalize failed: {self.finalize_error}")
        elif not self.finalized.get("moved"):
            found.append(f"state migrate --finalize moved no partition: {self.finalized}")
        stopped = {m.role: m.exits for m in self.pipeline.left if m.role.startswith(SUBSCRIPTIONS)}
        for role, exits in stopped.items():
            if exits[-1:] != [0]:
                found.append(f"{role} did not stop cleanly: its exits were {exits}")
            if LAYOUT_REFUSED in exits:
                found.append(f"{role} refused the layout before the finalize: {exits}")
        assert self.refusal is not None
        code, said = self.refusal
        if self.layout < LAYOUT:
            if code != LAYOUT_REFUSED or f"state layout {LAYOUT}" not in said:
                found.append(
                    f"the previous release {self.version}, started after the finalize, exited "
                    f"{code}, not {LAYOUT_REFUSED} naming layout {LAYOUT} (its log: "
                    "previous-release-after-finalize.log)"
                )
        elif code != 0:
            found.append(
                f"the previous release {self.version} speaks this layout, yet exited {code}"
            )
        return found

    def notes(self) -> dict[str, object]:
        return {
            "previous_release": f"{self.version} ({self.commit}, layout {self.layout})",
            "finalized": self.finalized,
            "previous_after_finalize": self.refusal[0] if self.refusal else None,
        }
