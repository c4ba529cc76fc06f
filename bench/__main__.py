from __future__ import annotations

import argparse
import json

from bench.harness import CASES, load_cases, median_rounds, run_all, run_one, table


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--env", help=argparse.SUPPRESS)
    parser.add_argument("--size", type=int, default=50_000, help="events per case")
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run the cases this many times, interleaved; each row is a case's median round",
    )
    parser.add_argument("cases", nargs="*", help="case names (default: all)")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_one(args.child, args.env, args.size)))
        return
    load_cases()

    if args.rounds < 1:
        parser.error(f"--rounds {args.rounds}: at least 1")
    names = args.cases or list(CASES)
    unknown = [n for n in names if n not in CASES]
    if unknown:
        parser.error(f"unknown case(s) {', '.join(map(repr, unknown))}; known: {', '.join(CASES)}")
    results = run_all(names * args.rounds, args.size)
    print(table(median_rounds(results)))


if __name__ == "__main__":
    main()
