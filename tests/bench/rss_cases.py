"""Two bench cases that start a child process using ~600 MB and wait for it: one counts its
children's peak RSS as the case's (as the e2e cases do), the other its own process's."""

from __future__ import annotations

import subprocess
import sys

from bench.harness import BenchEnv, case
from bench.rows import Row

CHILD_MB = 600


def _run_a_large_child(env: BenchEnv) -> list[Row]:
    subprocess.run(
        [sys.executable, "-c", f"block = b'x' * ({CHILD_MB} << 20)"], check=True, timeout=60
    )
    return [Row("ran", 1.0, "x")]


case("rss-of-children", children=True)(_run_a_large_child)
case("rss-of-itself")(_run_a_large_child)
