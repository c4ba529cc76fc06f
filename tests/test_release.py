"""The release record: one version (pyproject.toml), and CHANGELOG.md naming each release with
its commit and state layout (``rhumbatron --version``: tests/router/cli/test_read_commands.py)."""

from __future__ import annotations

import re
import subprocess
import tomllib

import pytest

from consumers.runtime.layout import LAYOUT
from tests.support.environment import ROOT

VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
ENTRY = re.compile(r"^## (\d+\.\d+\.\d+)\n\n- Commit: (\S.*)\n- State layout: (.+)$", re.M)


def _entries() -> list[tuple[str, str, str]]:
    return ENTRY.findall((ROOT / "CHANGELOG.md").read_text())


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=30
        )
    except OSError:
        return None
    return done.stdout if done.returncode == 0 else None


def test_the_newest_entry_is_the_version_built_and_speaks_its_layout() -> None:
    entries = _entries()
    assert entries, "CHANGELOG.md has no release entry in the expected shape"
    version, _, layout = entries[0]
    assert version == VERSION
    assert f"speaks {LAYOUT}" in layout
    versions = [tuple(int(n) for n in v.split(".")) for v, _, _ in entries]
    assert versions == sorted(versions, reverse=True) and len(set(versions)) == len(versions)
    # Only the newest release may be waiting for its commit to be recorded.
    assert all(re.fullmatch(r"[0-9a-f]{7,40}", c) for _, c, _ in entries[1:])


def test_each_recorded_commit_exists_and_carries_its_version() -> None:
    if _git("rev-parse", "--is-shallow-repository") != "false\n":
        pytest.skip("needs the full git history (a clone that is not shallow)")
    for version, commit, _ in _entries():
        if not re.fullmatch(r"[0-9a-f]{7,40}", commit):
            continue
        pyproject = _git("show", f"{commit}:pyproject.toml")
        assert pyproject is not None, f"CHANGELOG.md: {version}'s commit {commit} is not in git"
        found = tomllib.loads(pyproject)["project"]["version"]
        assert found == version, f"{commit} is version {found}, not {version}"


def test_the_image_and_the_chart_name_the_same_version() -> None:
    dockerfile = (ROOT / "infra" / "deploy" / "Dockerfile").read_text()
    assert f"ARG VERSION={VERSION}\n" in dockerfile
    chart = (ROOT / "infra" / "deploy" / "helm" / "rhumbatron" / "Chart.yaml").read_text()
    assert f'appVersion: "{VERSION}"' in chart and f"version: {VERSION}" in chart
