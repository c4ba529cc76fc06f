"""The bench's arithmetic and shape, without a broker: a row is the median of its rounds, its
spread half their range over the median, its ratio its median over its vs row's median of the
same run; a failed case is a FAILED row; rows come in the table's order; the JSON has the
machine and the six keys of every row."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from typing import Any

import pytest

from bench.harness import (
    CASES,
    ROW_ORDER,
    aggregate,
    last_error,
    load_cases,
    order_key,
    planned_runs,
    report,
    spread_pct,
    table,
)


def _result(
    case: str, round_no: int, rss: float, *rows: tuple[str, float, str | None]
) -> dict[str, Any]:
    return {
        "case": case,
        "round": round_no,
        "rss_mb": rss,
        "rows": [
            {"name": n, "value": v, "unit": "events/s", "vs": vs, "note": ""} for n, v, vs in rows
        ],
    }


def _by_name(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {r["name"]: r for r in rows}


def test_a_row_is_the_median_of_its_rounds_with_its_spread_and_ratio() -> None:
    results = [
        _result("raw-consume", 1, 80, ("raw-consume", 100_000, None)),
        _result("projector", 1, 90, ("projector", 30_000, "raw-consume")),
        _result("raw-consume", 2, 82, ("raw-consume", 120_000, None)),
        _result("projector", 2, 95, ("projector", 20_000, "raw-consume")),
        _result("raw-consume", 3, 81, ("raw-consume", 80_000, None)),
        _result("projector", 3, 91, ("projector", 25_000, "raw-consume")),
    ]
    rows = _by_name(aggregate(results))
    assert rows["raw-consume"]["value"] == 100_000
    assert rows["raw-consume"]["spread"] == pytest.approx(20.0)  # (120k - 80k) / 2 / 100k
    assert rows["projector"]["value"] == 25_000
    assert rows["projector"]["ratio"] == pytest.approx(0.25)  # the medians, not one round's
    assert rows["projector"]["spread"] == pytest.approx(20.0)
    assert rows["projector"]["rss_mb"] == 95
    assert rows["projector"]["rounds"] == [30_000, 20_000, 25_000]
    assert rows["rss-mb"]["value"] == 95
    assert "projector" in rows["rss-mb"]["note"]


def test_scale_projects_is_the_ratio_of_its_two_rows_round_by_round() -> None:
    results = [
        _result("projector", 1, 90, ("projector", 10_000, "raw-consume")),
        _result("scale", 1, 90, ("scale-100k", 8_000, "projector")),
        _result("projector", 2, 90, ("projector", 5_000, "raw-consume")),
        _result("scale", 2, 90, ("scale-100k", 4_500, "projector")),
        _result("projector", 3, 90, ("projector", 20_000, "raw-consume")),  # scale failed here
    ]
    rows = _by_name(aggregate(results))
    assert rows["scale-projects"]["rounds"] == [0.8, 0.9]  # rounds 1 and 2, not medians
    assert rows["scale-projects"]["value"] == pytest.approx(0.85)
    assert rows["scale-projects"]["spread"] == pytest.approx(0.05 / 0.85 * 100)
    assert "scale-projects" not in _by_name(aggregate(results[:1] + results[2:3]))


def test_a_once_case_runs_in_the_first_round_only() -> None:
    load_cases()
    assert CASES["scale-rss"].once and not CASES["projector"].once
    assert planned_runs(["projector", "scale-rss"], 3) == 4


def test_rss_mb_is_the_largest_of_rhumbatrons_own_processes() -> None:
    rows = _by_name(
        aggregate(
            [
                _result("raw-produce", 1, 900, ("raw-produce", 70_000, None)),
                _result("faust-agent", 1, 400, ("faust-agent", 1_000, "projector")),
                _result("projector", 1, 120, ("projector", 9_000, "raw-consume")),
                _result("ledger", 1, 110, ("ledger", 9_000, "raw-consume")),
            ]
        )
    )
    assert rows["raw-produce"]["rss_mb"] == 900  # shown on its own row
    assert rows["rss-mb"]["value"] == 120
    assert "projector" in rows["rss-mb"]["note"]


def test_one_round_has_no_spread_and_a_missing_baseline_no_ratio() -> None:
    rows = _by_name(aggregate([_result("ledger", 1, 70, ("ledger", 5_000, "raw-consume"))]))
    assert rows["ledger"]["spread"] is None
    assert rows["ledger"]["ratio"] is None
    assert spread_pct([10.0, 10.0]) == 0.0
    assert spread_pct([0.0, 0.0]) is None


def test_a_failed_case_is_a_failed_row_and_a_partial_failure_keeps_its_other_rounds() -> None:
    results = [
        _result("raw-consume", 1, 80, ("raw-consume", 100_000, None)),
        {"case": "ledger", "round": 1, "error": "RuntimeError: Redis went away"},
        _result("projector", 1, 90, ("projector", 30_000, "raw-consume")),
        {"case": "projector", "round": 2, "error": "ValueError: bad"},
    ]
    rows = _by_name(aggregate(results))
    assert rows["ledger"]["failed"] is True
    assert rows["ledger"]["value"] is None
    assert "RuntimeError: Redis went away" in rows["ledger"]["note"]
    assert rows["projector"]["value"] == 30_000
    assert "FAILED (round 2): ValueError: bad" in rows["projector"]["note"]
    text = table(list(rows.values()))
    assert (
        "FAILED"
        in text.splitlines()[[line.split()[0] for line in text.splitlines()].index("ledger")]
    )


def test_rows_come_in_the_table_order_whatever_order_they_were_measured_in() -> None:
    names = [n for n in ROW_ORDER if n != "rss-mb"] + [
        "publisher-10-per-pass",
        "e2e-5k-p50-ms",
        "zzz",
    ]
    shuffled = names[:]
    random.Random(3).shuffle(shuffled)
    results = [_result(n, 1, 10, (n, 1.0, None)) for n in shuffled]
    got = [r["name"] for r in aggregate(results)]
    assert got[: ROW_ORDER.index("publisher-postgres") + 2] == [
        "raw-produce",
        "raw-produce-broker-cpu-us",
        "raw-consume",
        "publisher",
        "publisher-postgres",
        "publisher-10-per-pass",
    ]
    assert got.index("e2e-5k-p50-ms") == got.index("e2e-p999-ms") + 1
    assert got.index("worker-flaky") < got.index("faust-agent") < got.index("e2e-p50-ms")
    assert got.index("e2e-p999-ms") < got.index("claim-bytes") < got.index("rss-mb")
    assert got.index("rss-mb") < got.index("scale-projects") < got.index("zzz") == len(got) - 1
    assert order_key("raw-consume-queue") < order_key("worker")


def test_the_json_has_the_machine_and_the_six_keys_of_every_row() -> None:
    rows = aggregate(
        [
            _result("raw-consume", 1, 80, ("raw-consume", 100_000, None)),
            _result("ledger", 1, 80, ("ledger", 40_000, "raw-consume")),
            {"case": "projector", "round": 1, "error": "boom"},
        ]
    )
    shaped = json.loads(json.dumps(report({"cpu": "x", "cores": 2}, rows)))
    assert set(shaped) == {"machine", "rows"}
    assert shaped["machine"] == {"cpu": "x", "cores": 2}
    for row in shaped["rows"]:
        assert {"name", "value", "unit", "vs", "ratio", "spread"} <= set(row)
    assert _by_name(shaped["rows"])["ledger"]["ratio"] == pytest.approx(0.4)


def test_a_failed_childs_error_is_the_line_naming_its_exception() -> None:
    stderr = (
        "Traceback (most recent call last):\n"
        '  File "x.py", line 1, in <module>\n'
        'psycopg.errors.UndefinedTable: relation "t" does not exist\n'
        'LINE 1: SELECT 1 FROM "t"\n'
        "                      ^\n"
    )
    failed = subprocess.CompletedProcess(["x"], 1, stdout="", stderr=stderr)
    assert last_error(failed) == 'psycopg.errors.UndefinedTable: relation "t" does not exist'
    bare = subprocess.CompletedProcess(["x"], 1, stdout="", stderr="killed\n")
    assert last_error(bare) == "killed"


@pytest.mark.parametrize(
    ("name", "low", "high"), [("rss-of-children", 600, None), ("rss-of-itself", 300, 600)]
)
def test_a_case_of_child_processes_reports_their_peak_rss_not_its_own(
    name: str, low: int, high: int | None, tmp_path: Any
) -> None:
    # A fresh interpreter: this one's earlier children would count in RUSAGE_CHILDREN too.
    script = (
        "import json, pathlib\n"
        "from bench.harness import run_one\n"
        f"result = run_one({name!r}, 'rsstest', 1, quick=True, run_dir=pathlib.Path({str(tmp_path)!r}),"
        " round_no=1, module='tests.bench.rss_cases')\n"
        "print(json.dumps(result['rss_mb']))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120
    )
    rss_mb = json.loads(done.stdout.strip().splitlines()[-1])
    # The child's 600 MB, not the driver's ~40; the case's own 300 MB, not its children's 0.
    assert rss_mb >= low and (high is None or rss_mb < high), rss_mb
