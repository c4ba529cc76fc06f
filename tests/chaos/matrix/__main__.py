"""``python -m tests.chaos.matrix [NAME ...]`` (``make chaos``): run every row of the matrix, or
the named ones, one line each as it finishes, then ``chaos: N/M rows passed``; the matrix with
every row's problems goes to ``.local/chaos.json``. Exits 1 when any row failed."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from datetime import UTC, datetime

from tests.chaos.matrix.runner import LOGS, Row, run_row
from tests.chaos.matrix.scenarios import SCENARIOS, by_name
from tests.support.environment import ROOT

REPORT = ROOT / ".local" / "chaos.json"


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    # As the test suite's autouse fixture does: the developer's (and make's) settings must not
    # leak into the rows' own; RHUMBATRON_TEST_* name the shared servers and stay.
    for name in list(os.environ):
        if name.startswith("RHUMBATRON_") and not name.startswith("RHUMBATRON_TEST_"):
            del os.environ[name]
    parser = argparse.ArgumentParser(prog="python -m tests.chaos.matrix", description=__doc__)
    parser.add_argument("names", nargs="*", help="rows to run (default: every row)")
    parser.add_argument("--fast", action="store_true", help="only the rows `make test` runs")
    args = parser.parse_args(argv)
    # Stopped from outside (a timeout, a cancelled job), a row still stops its members and
    # removes its environment on the way out, as on Ctrl-C: nothing is left running.
    signal.signal(signal.SIGTERM, _interrupt)
    rows = by_name(args.names) if args.names else list(SCENARIOS)
    if args.fast:
        rows = [r for r in rows if r.fast]
    started = datetime.now(UTC)
    clock = time.monotonic()
    done: list[Row] = []
    for n, scenario in enumerate(rows, 1):
        print(f"chaos: row {n}/{len(rows)}: {scenario.name}", file=sys.stderr, flush=True)
        row = run_row(scenario)
        done.append(row)
        print(row.line(), flush=True)
        if row.figures:
            print(f"     figures: {row.figures}", flush=True)
        for name, problems in row.problems.items():
            for problem in problems:
                print(f"     {name}: {problem}", flush=True)
        if row.notes:
            print(f"     notes: {row.notes}", flush=True)
        if not row.passed:
            print(f"     logs: {row.logs}", flush=True)
    passed = sum(r.passed for r in done)
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    REPORT.write_text(
        json.dumps(
            {
                "started": started.isoformat(timespec="seconds"),
                "seconds": round(time.monotonic() - clock, 1),
                "passed": passed,
                "rows": [r.as_dict() for r in done],
                "logs": str(LOGS.relative_to(ROOT)),
            },
            indent=2,
        )
        + "\n"
    )
    print(f"chaos: {passed}/{len(done)} rows passed ({time.monotonic() - clock:.0f}s)")
    return 0 if passed == len(done) else 1


if __name__ == "__main__":
    sys.exit(main())
