"""The shape of the tree, held by tests so it cannot drift: imports point one way (router ->
consumers -> streams), the command line is imported by nothing but itself, and a class name means
one thing across the packages."""

from __future__ import annotations

import ast
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.environment import ROOT

PACKAGES = ("streams", "consumers", "router", "rhumbatron")
# rhumbatron is the public front door: it imports the rest, and nothing of ours imports it.
FORBIDDEN = {
    "streams": {"consumers", "router", "rhumbatron"},
    "consumers": {"router", "rhumbatron"},
    "router": {"rhumbatron"},
}
CLI = "router.cli"


def _sources(*packages: str) -> Iterator[Path]:
    for package in packages:
        yield from sorted((ROOT / package).rglob("*.py"))


def _module_of(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported_modules(path: Path) -> set[str]:
    """Every absolute module an import statement names (``from a.b import c`` gives ``a.b`` and
    ``a.b.c``, since ``c`` may be a module)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_imports_point_one_way(package: str) -> None:
    offenders = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in _sources(package)
        for name in sorted(_imported_modules(path))
        if name.split(".")[0] in FORBIDDEN[package]
    ]
    assert not offenders, offenders


def test_nothing_outside_the_command_line_imports_it() -> None:
    """Service code, the bench and the tests reach what a command does through router/wiring and
    below; a command module is a thin shell that only the command line itself imports. Other
    tests run commands as a user does, through ``python -m router.cli``."""
    # The command line's own tests mirror it (tests/router/cli/); the test subscription process
    # and the chaos matrix's command worker are themselves small command lines.
    cli_tests = ROOT / "tests" / "router" / "cli"
    command_lines = {
        ROOT / "tests" / "support" / "subscription_main.py",
        ROOT / "tests" / "chaos" / "matrix" / "command_worker.py",
    }
    offenders = []
    for path in _sources("rhumbatron", "streams", "consumers", "router", "bench", "tests"):
        module = _module_of(path)
        if module == CLI or module.startswith(CLI + ".") or path.is_relative_to(cli_tests):
            continue
        if path in command_lines:
            continue
        offenders += [
            f"{path.relative_to(ROOT)} imports {name}"
            for name in sorted(_imported_modules(path))
            if name == CLI or name.startswith(CLI + ".")
        ]
    assert not offenders, offenders


def test_a_class_name_means_one_thing_across_the_packages() -> None:
    defined: dict[str, list[str]] = defaultdict(list)
    for path in _sources(*PACKAGES):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                defined[node.name].append(f"{path.relative_to(ROOT)}:{node.lineno}")
    twice = {name: places for name, places in defined.items() if len(places) > 1}
    assert not twice, twice


def test_the_layering_checks_see_the_whole_tree() -> None:
    """A guard on the guards: the scans above read every package (a moved folder would
    otherwise leave them passing over nothing)."""
    for package in PACKAGES:
        # The public package is a thin front door over the rest; the others are the house.
        assert len(list(_sources(package))) >= (2 if package == "rhumbatron" else 10), package
