"""The shipped deployment settings (infra/deploy/config.toml), changed key by key into a file of
a test's own: what ``rhumbatron fleet manifests`` renders from, or what a pod run as a process
reads."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

from tests.support.environment import ROOT

DEPLOY = ROOT / "infra" / "deploy"
CONFIG = DEPLOY / "config.toml"


def deployment_config(tmp_path: Path, **changes: Any) -> Path:
    """The committed deployment settings with ``changes`` (None: the key removed), written to
    ``tmp_path/config.toml``."""
    data = tomllib.loads(CONFIG.read_text())
    for key, value in changes.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    path = tmp_path / "config.toml"
    path.write_text("\n".join(_table("", data)) + "\n")
    assert tomllib.loads(path.read_text()) == data
    return path


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string of printable text is a TOML basic string
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return str(value)


def _table(prefix: str, data: dict[str, Any]) -> list[str]:
    plain = [f"{_toml(k)} = {_toml(v)}" for k, v in data.items() if not isinstance(v, dict)]
    lines = [f"[{prefix}]", *plain] if prefix else plain
    for key, value in data.items():
        if isinstance(value, dict):
            lines += _table(f"{prefix}.{_toml(key)}" if prefix else _toml(key), value)
    return lines
