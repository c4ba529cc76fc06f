"""Imports point one way: router -> consumers -> streams."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN = {"streams": {"consumers", "router"}, "consumers": {"router"}}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_imports_point_one_way(package: str) -> None:
    offenders = [
        f"{path.relative_to(ROOT)} imports {bad}"
        for path in sorted((ROOT / package).rglob("*.py"))
        for bad in _imports(path) & FORBIDDEN[package]
    ]
    assert not offenders, offenders
