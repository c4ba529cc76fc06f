"""The bench command: a wrong case name or round count is refused naming what was wrong; one tiny
run of one case, through the installed ``rhumbatron`` entry point from outside the checkout,
prints the JSON the issue asks for."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.__main__ import main as bench_main

ENTRY_POINT = Path(sys.executable).parent / "rhumbatron"


def _bench(cwd: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RHUMBATRON_")}
    return subprocess.run(
        [str(ENTRY_POINT), "bench", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _refusal(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """``python -m bench ARGS`` in this process (the options and checks ``rhumbatron bench``
    shares): it must exit 2; its stderr."""
    with pytest.raises(SystemExit) as exited:
        bench_main(list(args))
    assert exited.value.code == 2
    return capsys.readouterr().err


def test_an_unknown_case_is_refused_naming_it_and_the_known_ones(
    capsys: pytest.CaptureFixture[str],
) -> None:
    err = _refusal(capsys, "raw-consume", "no-such-case")
    assert "unknown case 'no-such-case'" in err
    assert "raw-consume" in err.split("the cases:", 1)[1]


def test_zero_rounds_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert "--rounds: 0: at least 1" in _refusal(capsys, "--rounds", "0", "raw-consume")
    assert "'two' is not a whole number" in _refusal(capsys, "--rounds", "two")


@pytest.mark.integration
def test_one_round_of_raw_consume_prints_the_machine_and_its_rows(tmp_path: Path) -> None:
    result = _bench(tmp_path, "--quick", "--json", "--rounds", "1", "--size", "200", "raw-consume")
    assert result.returncode == 0, result.stderr[-3000:]
    shaped = json.loads(result.stdout)
    assert set(shaped) == {"machine", "rows"}
    for key in ("cpu", "cores", "memory_gb", "os", "python", "librdkafka", "redis", "date"):
        assert shaped["machine"][key], key
    names = [row["name"] for row in shaped["rows"]]
    assert names == ["raw-consume"]  # rss-mb is of Rhumbatron's processes, none ran
    for row in shaped["rows"]:
        assert {"name", "value", "unit", "vs", "ratio", "spread"} <= set(row)
    consume = shaped["rows"][0]
    assert consume["unit"] == "events/s" and consume["value"] > 0
    assert "removed the run's" in result.stderr  # its topics and keys are gone again
    assert "could not remove" not in result.stderr
