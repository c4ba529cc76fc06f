"""``rhumbatron bench``: the benchmark (the ``bench`` package beside ``router`` in a source
checkout; docs/performance.md). The options and the run live in bench.harness, shared with
``python -m bench``."""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path
from types import ModuleType

from router.settings import Settings
from streams.errors import ConfigurationError

# The bench is not part of the installed packages: it is a folder of the source checkout, the
# parent of router/ (an editable install maps only the product's packages).
CHECKOUT = Path(__file__).resolve().parents[2]


def _harness() -> ModuleType | None:
    if (CHECKOUT / "bench" / "harness.py").is_file() and str(CHECKOUT) not in sys.path:
        sys.path.append(str(CHECKOUT))
    try:
        return importlib.import_module("bench.harness")
    except ModuleNotFoundError as exc:
        if exc.name not in {"bench", "bench.harness"}:
            raise
        return None


def bench(settings: Settings, args: argparse.Namespace) -> int:
    harness = _harness()
    if harness is None:
        raise ConfigurationError(
            f"bench: no bench package at {CHECKOUT / 'bench'}; it runs from a source checkout"
        )
    try:
        code: int = harness.run_command(args)
    except harness.UnknownCase as exc:
        args.parser.error(str(exc))
    return code


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    harness = _harness()
    description = harness.DESCRIPTION if harness else "the benchmark (needs a source checkout)"
    p = sub.add_parser(
        "bench",
        help="measure throughput, latency and memory beside the raw Kafka client (one table)",
        description=description,
    )
    if harness is not None:
        harness.add_arguments(p)
    p.set_defaults(handler=bench, parser=p)
