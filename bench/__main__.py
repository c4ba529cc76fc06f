"""``python -m bench``: the same command as ``rhumbatron bench`` (same options), and the child side
of a run (``--child CASE``, what the harness starts once per case per round)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from bench.harness import DESCRIPTION, UnknownCase, add_arguments, run_command, run_one


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=DESCRIPTION)
    add_arguments(parser)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--env", help=argparse.SUPPRESS)
    parser.add_argument("--round", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--run-dir", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--module", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        result = run_one(
            args.child,
            args.env,
            args.size,
            quick=args.quick,
            run_dir=args.run_dir,
            round_no=args.round,
            module=args.module,
        )
        print(json.dumps(result))
        return 0
    try:
        return run_command(args)
    except UnknownCase as exc:
        parser.error(str(exc))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
