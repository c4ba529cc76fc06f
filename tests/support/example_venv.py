"""An example package (examples/<name>) installed as a user installs it: the wheel of this
checkout and the example's into a virtual environment of their own, from local wheels only
(``--no-index``), never into the checkout's .venv, so the example's entry points reach no other
test."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tests.support.environment import ROOT

# The product's packages, and the files its wheel is built from.
PRODUCT_PACKAGES = ("rhumbatron", "router", "consumers", "streams")
PRODUCT_FILES = ("pyproject.toml", "README.md")
BUILD_TIMEOUT_S = 900


def example_venv(root: Path, example: Path, requirement: str) -> Path:
    """A venv under ``root`` with ``requirement`` (the example's distribution and its extras,
    e.g. ``acme-handlers[test]``) installed from the wheels of this checkout and ``example``."""
    wheels = root / "wheels"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    # Built from copies: a build writes build/ and *.egg-info beside the sources, and two test
    # runs of one checkout must not share them.
    ignore = shutil.ignore_patterns("__pycache__", "build", "*.egg-info", ".pytest_cache")
    product, copy = root / "rhumbatron-src", root / "example-src"
    product.mkdir()
    for name in PRODUCT_FILES:
        shutil.copy(ROOT / name, product / name)
    for package in PRODUCT_PACKAGES:
        shutil.copytree(ROOT / package, product / package, ignore=ignore)
    shutil.copytree(example, copy, ignore=ignore)
    # The wheels of this checkout, the example and everything they need; then an install that
    # may use nothing else.
    subprocess.run(
        [*pip, "wheel", "--wheel-dir", str(wheels), str(product), str(copy), "pytest>=8"],
        check=True,
        timeout=BUILD_TIMEOUT_S,
    )
    env_dir = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(env_dir)], check=True, timeout=120)
    subprocess.run(
        [
            str(env_dir / "bin" / "python"),
            "-m",
            "pip",
            "--disable-pip-version-check",
            "-q",
            "install",
            "--no-index",
            "--find-links",
            str(wheels),
            requirement,
        ],
        check=True,
        timeout=BUILD_TIMEOUT_S,
    )
    return env_dir


def run_example_tests(
    venv: Path, example: Path, *, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """The example's own tests, by that venv's pytest, from the example's folder."""
    return subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=example,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
