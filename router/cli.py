"""The ``rhumbatron`` command line. Each subcommand is a thin shell over service code; every error
we raise on purpose is printed as one line naming what was wrong, with a non-zero exit."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence

import orjson

from router import commands
from router.settings import Settings
from streams.errors import RhumbatronError

Handler = Callable[[Settings, argparse.Namespace], int]


def _print_json(value: object) -> None:
    sys.stdout.write(orjson.dumps(value, option=orjson.OPT_INDENT_2).decode() + "\n")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rhumbatron", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser(
        "provision", help="create the environment's streams, queues and internal topics"
    )
    p.set_defaults(handler=commands.provision)

    p = sub.add_parser("topology", help="the environment's topics as they exist on the broker")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler=commands.topology)

    p = sub.add_parser("produce", help="write a synthetic workload of M events over N projects")
    p.add_argument("--projects", type=int, required=True)
    p.add_argument("--events", type=int, required=True)
    p.add_argument("--run", help="run id baked into project ids (default: random)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=commands.produce)

    p = sub.add_parser("status", help="topics, and consumer lag per group and partition")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=commands.status)

    p = sub.add_parser("demo", help="the main job: provision, produce, consume, print the figures")
    p.add_argument("--projects", type=int, default=200)
    p.add_argument("--events", type=int, default=10_000)
    p.set_defaults(handler=commands.demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not args.verbose:
        # librdkafka reports every refused connection; our own errors say it once, better.
        logging.getLogger("rhumbatron.librdkafka").setLevel(logging.CRITICAL)
    try:
        settings = Settings()
        handler: Handler = args.handler
        return handler(settings, args)
    except RhumbatronError as exc:
        print(f"rhumbatron: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
