"""The router image's steps (infra/deploy/Dockerfile), read from the Dockerfile itself so these
tests follow it: the build stage copies every package and data file the wheel holds; the wheel
built from only those copies, with the Dockerfile's extras, installed (not editable) into a venv
of its own, runs its entrypoint as the image does (another user than the installer where the
tests run as root, from a folder outside the checkout, with a state dir and HOME of its own)
against the real Kafka, Redis and PostgreSQL; and, where a container engine is installed, the
image itself is built by infra/deploy/build-image.sh and does the same in a container."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest
from setuptools import find_packages

from consumers.runtime.types import TP
from router.settings import Settings
from streams.envelopes import Event
from streams.workload import slotted_events, workload
from tests.support.environment import ROOT
from tests.support.postgres import FreshSchema
from tests.support.projector_oracle import expected_view
from tests.support.runtime_processes import publish, runtime_settings

DOCKERFILE = ROOT / "infra" / "deploy" / "Dockerfile"
BUILD_IMAGE = ROOT / "infra" / "deploy" / "build-image.sh"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
VERSION = PYPROJECT["project"]["version"]
# The image's user (USER in the Dockerfile): the one the installed entrypoint runs as here when
# the tests run as root.
IMAGE_UID = 10001
SYSTEM_BINS = ("/usr/local/bin", "/usr/bin")
SLUG = "project-view-projector"
BUILD_TIMEOUT_S = 900
# The image's base in the container test: the stand-in build-image.sh makes from Debian's
# packages unless the variable names another (python:3.11-slim-bookworm where it can be pulled).
IMAGE_BASE = os.environ.get("RHUMBATRON_TEST_IMAGE_BASE", "debian")


@dataclass(frozen=True)
class Steps:
    """What the Dockerfile does, as far as these tests follow it."""

    copied: tuple[str, ...]  # the build context's paths its build stage copies
    wheel_extras: str  # the extras of `pip wheel ".[...]"`
    install_extras: str  # the extras of `pip install "rhumbatron[...]==${VERSION}"`
    env: dict[str, str]  # its ENV, as the entrypoint sees it
    user: str


def _instructions(text: str) -> list[tuple[str, str]]:
    """(instruction, arguments) per instruction, continuation lines joined, comments dropped."""
    joined = re.sub(
        r"\\\n",
        " ",
        "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#")),
    )
    out: list[tuple[str, str]] = []
    for line in joined.splitlines():
        if line.strip():
            word, _, rest = line.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def _steps() -> Steps:
    copied: list[str] = []
    wheel_extras = install_extras = user = ""
    env: dict[str, str] = {}
    for word, rest in _instructions(DOCKERFILE.read_text()):
        args = shlex.split(rest)
        if word == "COPY" and not args[0].startswith("--"):
            copied.extend(a.rstrip("/") for a in args[:-1])
        elif word == "RUN" and (found := re.search(r'pip wheel .*"\.\[([^\]]*)\]"', rest)):
            wheel_extras = found.group(1)
        elif word == "RUN" and (
            found := re.search(r'pip install .*"rhumbatron\[([^\]]*)\]==', rest)
        ):
            install_extras = found.group(1)
        elif word == "ENV":
            for assignment in args:
                name, _, value = assignment.partition("=")
                env[name] = value
        elif word == "USER":
            user = rest
    assert copied and wheel_extras and install_extras and user, (
        f"{DOCKERFILE} no longer reads as these tests expect: COPY {copied}, wheel extras "
        f"{wheel_extras!r}, install extras {install_extras!r}, USER {user!r}"
    )
    return Steps(tuple(copied), wheel_extras, install_extras, env, user)


def _wheel_packages() -> set[str]:
    """The top-level packages the wheel holds: setuptools' find over the checkout, as the build
    runs it."""
    include = PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]
    return {name.split(".")[0] for name in find_packages(where=str(ROOT), include=include)}


def _package_data() -> list[str]:
    """Every package-data file the wheel holds, relative to the checkout."""
    out: list[str] = []
    for package, patterns in PYPROJECT["tool"]["setuptools"]["package-data"].items():
        folder = ROOT.joinpath(*package.split("."))
        for pattern in patterns:
            matched = sorted(folder.glob(pattern))
            assert matched, f"package-data {package}: {pattern} matches no file"
            out.extend(str(p.relative_to(ROOT)) for p in matched)
    return out


def test_the_build_stage_copies_every_package_and_data_file_of_the_wheel() -> None:
    steps = _steps()
    assert {"pyproject.toml", PYPROJECT["project"]["readme"]} <= set(steps.copied)
    missing = _wheel_packages() - set(steps.copied)
    assert not missing, f"the wheel holds packages {sorted(missing)} the Dockerfile does not COPY"
    for data in _package_data():
        assert data.split("/")[0] in steps.copied, f"{data} is not in a COPY'd folder"


def test_both_stages_name_the_same_extras_and_each_exists() -> None:
    steps = _steps()
    assert steps.wheel_extras == steps.install_extras
    declared = set(PYPROJECT["project"]["optional-dependencies"])
    assert set(steps.wheel_extras.split(",")) <= declared
    assert "dev" not in steps.wheel_extras.split(",")
    assert steps.user == f"{IMAGE_UID}:{IMAGE_UID}"


# ---------------------------------------------------------------- the installed wheel, run


@dataclass(frozen=True)
class Installed:
    venv: Path
    home: Path  # the runner's HOME, cwd and state dir
    as_root: bool


def _private_dir(owner: int | None) -> Path:
    """A folder outside the checkout and outside pytest's (root-only) tmp tree, for ``owner``."""
    path = Path(tempfile.mkdtemp(prefix="rhumbatron-image-"))
    if owner is not None:
        os.chown(path, owner, owner)
    return path


def _interpreter(as_root: bool) -> str:
    """A CPython 3.11 the entrypoint's user may run: this one, or (as root, whose own Python may
    sit in a home only root enters) the first of the system's that the image's user can run."""
    ours = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    if not as_root:
        return ours
    candidates = [ours, *filter(None, (shutil.which("python3.11", path=p) for p in SYSTEM_BINS))]
    for candidate in candidates:
        try:
            probe = subprocess.run(
                [candidate, "-c", "import ensurepip"],
                user=IMAGE_UID,
                group=IMAGE_UID,
                extra_groups=[],
                cwd="/",
                capture_output=True,
                check=False,
                timeout=60,
            )
        except PermissionError:  # a folder on its path is closed to that user
            continue
        if probe.returncode == 0:
            return candidate
    raise AssertionError(
        f"no Python 3.11 with venv that uid {IMAGE_UID} can run (tried {candidates}): install "
        "python3.11-venv, or run the tests as another user than root"
    )


@pytest.fixture(scope="module")
def installed() -> Iterator[Installed]:
    """The Dockerfile's two stages on this machine: the wheels from copies of only what its build
    stage copies, then a fresh venv with only them installed, read-only to the user who runs it."""
    steps = _steps()
    as_root = os.getuid() == 0
    build = _private_dir(None)
    home = _private_dir(IMAGE_UID if as_root else None)
    try:
        context, wheels, venv = build / "src", build / "wheels", build / "venv"
        context.mkdir()
        ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
        for name in steps.copied:
            source = ROOT / name
            if source.is_dir():
                shutil.copytree(source, context / name, ignore=ignore)
            else:
                shutil.copy(source, context / name)
        pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
        subprocess.run(
            [*pip, "wheel", "--wheel-dir", str(wheels), f".[{steps.wheel_extras}]"],
            cwd=context,
            check=True,
            timeout=BUILD_TIMEOUT_S,
        )
        subprocess.run([_interpreter(as_root), "-m", "venv", str(venv)], check=True, timeout=120)
        subprocess.run(
            [
                str(venv / "bin" / "python"),
                *pip[1:],
                "install",
                "--no-index",
                "--find-links",
                str(wheels),
                f"rhumbatron[{steps.install_extras}]=={VERSION}",
            ],
            cwd=build,
            check=True,
            timeout=BUILD_TIMEOUT_S,
        )
        if not as_root:
            # Run by its own installer, the venv is held read-only by its modes (as root, the
            # runner is the image's user, whom root's ownership already holds off).
            subprocess.run(["chmod", "-R", "a-w", str(venv)], check=True)
        build.chmod(0o755)  # the runner reaches the venv, and nothing else of the build
        yield Installed(venv, home, as_root)
    finally:
        subprocess.run(["chmod", "-R", "u+w", str(build)], check=False)
        shutil.rmtree(build, ignore_errors=True)
        shutil.rmtree(home, ignore_errors=True)


def _entrypoint(
    installed: Installed, s: Settings, *args: str, timeout: float = 180
) -> subprocess.CompletedProcess[str]:
    """The image's entrypoint with ``args``, as its user, with the image's ENV and the settings
    of ``s`` (its own state dir): nothing of this checkout's environment reaches it."""
    env = {
        "PATH": f"{installed.venv / 'bin'}:/usr/bin:/bin",
        "HOME": str(installed.home),
        "LANG": "C.UTF-8",
        **_steps().env,
        **s.as_environment(),
        "RHUMBATRON_STATE_DIR": str(installed.home / "state"),
    }
    # As root, the image's user: the venv (root's) is then read-only to the entrypoint.
    uid = IMAGE_UID if installed.as_root else None
    return subprocess.run(
        [str(installed.venv / "bin" / "rhumbatron"), *args],
        cwd=installed.home,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        user=uid,
        group=uid,
        extra_groups=[] if installed.as_root else None,
    )


def _ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, f"{done.args} exited {done.returncode}:\n{done.stderr[-3000:]}"
    return done.stdout


def _events() -> list[Event]:
    return slotted_events(workload("img", 4, 60), tenant_id="t")


def _check_views(s: Settings, events: list[Event], view: Callable[[str], object]) -> None:
    for p in sorted({e.project_id for e in events}):
        tp = TP(*s.topology.partition_of(p))
        assert view(p) == expected_view(p, tp, events), p


@pytest.mark.slow
@pytest.mark.integration
def test_the_installed_wheel_alone_runs_the_entrypoint(
    installed: Installed, settings: Settings
) -> None:
    s = runtime_settings(settings)
    assert _ok(_entrypoint(installed, s, "--version")).startswith(f"rhumbatron {VERSION} (")
    # Imported from the venv, never from the checkout (the runner's cwd is its own folder).
    where = subprocess.run(
        [
            str(installed.venv / "bin" / "python"),
            "-c",
            "import router, streams, rhumbatron; "
            "print(router.__file__, streams.__file__, rhumbatron.__file__)",
        ],
        cwd=installed.home,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.split()
    assert all(path.startswith(str(installed.venv)) for path in where), where

    # The PostgreSQL outbox's schema is the wheel's package data.
    schema = FreshSchema(init=False)
    try:
        _ok(_entrypoint(installed, s, "outbox", "init", "--outbox", schema.url))
        with schema.connect() as conn:
            tables = {
                r[0]
                for r in conn.execute(
                    "SELECT table_name FROM information_schema.tables WHERE table_schema = %s",
                    (schema.name,),
                )
            }
        assert "outbox" in tables, tables
    finally:
        schema.drop()

    events = _events()
    _ok(_entrypoint(installed, s, "provision"))
    publish(s, events)
    done = _entrypoint(installed, s, "consume", "--subscription", SLUG, "--until-idle", "3")
    _ok(done)
    stats = re.search(r"(\d+) records, (\d+) applied", done.stderr)
    assert stats is not None, done.stderr[-2000:]
    assert [int(n) for n in stats.groups()] == [len(events), len(events)]
    _check_views(
        s, events, lambda p: orjson.loads(_ok(_entrypoint(installed, s, "view", p, "--json")))
    )


# ---------------------------------------------------------------- the image, where it can be built


def _engine() -> str | None:
    for name in ("podman", "docker"):
        if (
            shutil.which(name)
            and subprocess.run(
                [name, "info"], capture_output=True, timeout=60, check=False
            ).returncode
            == 0
        ):
            return name
    return None


def _dangling(engine: str) -> set[str]:
    listed = subprocess.run(
        [engine, "images", "--quiet", "--filter", "dangling=true"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return set(listed.stdout.split())


@pytest.mark.slow
@pytest.mark.integration
def test_the_image_builds_and_its_entrypoint_consumes(settings: Settings) -> None:
    engine = _engine()
    if engine is None:
        pytest.skip("no container engine answers here (podman info / docker info)")
    tag = f"localhost/rhumbatron-test:{settings.env}"
    before = _dangling(engine)
    try:
        built = subprocess.run(
            [str(BUILD_IMAGE), tag],
            env={**os.environ, "ENGINE": engine, "BASE": IMAGE_BASE},
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT_S * 2,
            check=False,
        )
        assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
        config = orjson.loads(
            subprocess.run(
                [engine, "image", "inspect", tag], capture_output=True, check=True, timeout=60
            ).stdout
        )[0]["Config"]
        assert config["User"] == f"{IMAGE_UID}:{IMAGE_UID}"
        assert config["Entrypoint"] == ["rhumbatron"]
        s = runtime_settings(settings)
        # build-image.sh run: the engine with the options this machine needs (its runtime, its
        # limits), so the container runs where the build did.
        run = [str(BUILD_IMAGE), "run", "--rm", "--network", "host"]
        for name, value in s.as_environment().items():
            if name != "RHUMBATRON_STATE_DIR":  # the image's own
                run += ["--env", f"{name}={value}"]

        def entrypoint(*args: str) -> str:
            done = subprocess.run(
                [*run, tag, *args],
                env={**os.environ, "ENGINE": engine},
                capture_output=True,
                text=True,
                timeout=300,
                check=False,
            )
            assert done.returncode == 0, f"{args} exited {done.returncode}:\n{done.stderr[-3000:]}"
            return done.stdout + done.stderr

        assert entrypoint("--version").startswith(f"rhumbatron {VERSION} (")
        events = _events()
        entrypoint("provision")
        publish(s, events)
        said = entrypoint("consume", "--subscription", SLUG, "--until-idle", "3")
        assert f"{len(events)} records, {len(events)} applied" in said, said[-2000:]
        _check_views(s, events, lambda p: orjson.loads(entrypoint("view", p, "--json")))
    finally:
        # The tag, and the build stage's image this build left untagged.
        left = sorted(_dangling(engine) - before)
        subprocess.run([engine, "rmi", tag, *left], capture_output=True, timeout=120, check=False)
