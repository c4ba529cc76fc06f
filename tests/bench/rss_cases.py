"""Two bench cases: one starts a child process using ~600 MB and counts its children's peak RSS
as the case's (as the e2e cases do); the other holds ~300 MB itself and counts its own process's.
The second starts no child: how a kernel charges a vfork'd child's memory is not this test's
business, and once in CI a child's 600 MB showed in its parent's own peak."""

from __future__ import annotations

import subprocess
import sys

from bench.harness import BenchEnv, case
from bench.rows import Row

CHILD_MB = 600
OWN_MB = 300


@case("rss-of-children", children=True)
def _run_a_large_child(env: BenchEnv) -> list[Row]:
    subprocess.run(
        [sys.executable, "-c", f"block = b'x' * ({CHILD_MB} << 20)"], check=True, timeout=60
    )
    return [Row("ran", 1.0, "x")]


@case("rss-of-itself")
def _hold_a_large_block(env: BenchEnv) -> list[Row]:
    block = b"x" * (OWN_MB << 20)
    return [Row("held", float(len(block) >> 20), "MB")]
