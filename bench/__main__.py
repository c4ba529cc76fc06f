from __future__ import annotations

import argparse
import json

from bench.harness import CASES, load_cases, run_all, run_one, table


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--env", help=argparse.SUPPRESS)
    parser.add_argument("--size", type=int, default=50_000, help="events per case")
    parser.add_argument("cases", nargs="*", help="case names (default: all)")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_one(args.child, args.env, args.size)))
        return
    load_cases()

    names = args.cases or list(CASES)
    results = run_all(names, args.size)
    print(table(results))


if __name__ == "__main__":
    main()
