"""The ``rhumbatron`` command line. Each subcommand is a thin shell over service code; every error
we raise on purpose is printed as one line naming what was wrong, with a non-zero exit: 2 for a
usage or input error (argparse's own and ours alike)."""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import signal
import sys
import textwrap
from collections.abc import Callable, Sequence
from typing import Any, cast

import redis
from redis.exceptions import RedisClusterException

from consumers.runtime.layout import LAYOUT
from router.cli import (
    acl_commands,
    analytics_commands,
    archive_commands,
    bench_commands,
    config_commands,
    dead_letter_commands,
    fleet_commands,
    logs,
    outbox_commands,
    project_commands,
    pump_commands,
    schema_commands,
    serve_commands,
    state_commands,
    stream_commands,
    subscription_commands,
    view_commands,
    worker_commands,
)
from router.settings import CONFIG_VARIABLE, Settings, load_settings
from streams.errors import InstanceIdHeld, LayoutNewer, RhumbatronError

# The docstring above is for readers of the code; this is what `rhumbatron --help` says.
DESCRIPTION = (
    "Rhumbatron moves domain events from a service's outbox to Kafka and runs subscriptions over "
    "them with exactly-once effects. Every read command takes --json; an error prints one line "
    "and exits 2 for a usage or input error."
)

Handler = Callable[[Settings, argparse.Namespace], int]

REGISTRARS: tuple[Callable[[argparse._SubParsersAction[argparse.ArgumentParser]], None], ...] = (
    stream_commands.register,
    archive_commands.register,
    subscription_commands.register,
    dead_letter_commands.register,
    outbox_commands.register,
    view_commands.register,
    project_commands.register,
    analytics_commands.register,
    serve_commands.register,
    worker_commands.register,
    config_commands.register,
    acl_commands.register,
    bench_commands.register,
    pump_commands.register,
    fleet_commands.register,
    schema_commands.register,
    state_commands.register,
)


class _Formatter(argparse.HelpFormatter):
    """Help lines wrapped at spaces only: a name with hyphens (project-view-projector,
    --until-idle) stays whole."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)


class _Parser(argparse.ArgumentParser):
    """Every parser of the CLI, its subcommands' too (they are made as their parent's type)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="rhumbatron", description=DESCRIPTION)
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    parser.add_argument(
        "--config",
        metavar="PATH",
        help=f"a TOML file of settings (keys: the settings' names), below the environment; "
        f"the same as {CONFIG_VARIABLE}=PATH",
    )
    parser.add_argument(
        "--version",
        action="version",
        version=f"rhumbatron {importlib.metadata.version('rhumbatron')} (state layout {LAYOUT})",
        help="print the installed version, and the state layout it speaks, and exit",
    )
    sub = cast(
        "argparse._SubParsersAction[argparse.ArgumentParser]",
        parser.add_subparsers(dest="command", required=True),
    )
    # Each area registers its own subcommands (one module per area, each with `register`).
    for register in REGISTRARS:
        register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    words = sys.argv[1:] if argv is None else list(argv)
    _refuse_undecodable(parser, words)
    args = parser.parse_args(words)
    log_handler = logs.configure(verbose=args.verbose)
    if args.config is not None:
        os.environ[CONFIG_VARIABLE] = args.config  # this command's children read it too
    try:
        settings = load_settings()
        logs.use_format(log_handler, settings.log_format)
        handler: Handler = args.handler
        code = handler(settings, args)
        sys.stdout.flush()  # a closed pipe shows here, inside the handling below
        return code
    except BrokenPipeError:
        return _reader_left()
    except InstanceIdHeld as exc:
        print(f"rhumbatron: {exc}", file=sys.stderr)
        return InstanceIdHeld.EXIT_CODE
    except LayoutNewer as exc:
        print(f"rhumbatron: {exc}", file=sys.stderr)
        return LayoutNewer.EXIT_CODE
    except RhumbatronError as exc:
        print(f"rhumbatron: {exc}", file=sys.stderr)
        return 2
    except (redis.RedisError, RedisClusterException) as exc:
        # Redis lost mid-run: the loops take redis-py's errors as they are (starting up, a Redis
        # that does not answer is already one of ours). Nothing is lost: the batch in hand was
        # put back, and the process's next start reads on from the cursor Redis holds.
        print(f"rhumbatron: Redis failed while running: {_redis_failure(exc)}", file=sys.stderr)
        return 1
    except OSError as exc:
        if exc.filename is None:
            raise
        # A path the file system refuses (too long, a directory, no permission) where a command
        # opens a file it was given: one line naming it, as any other refusal.
        print(f"rhumbatron: {exc.filename}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _refuse_undecodable(parser: argparse.ArgumentParser, words: list[str]) -> None:
    """Refuse, as argparse refuses a bad word, an argument whose bytes are not UTF-8 (Python
    hands them over with surrogates): names, ids and paths are UTF-8 text here, and such a word
    would fail far from the command line, wherever it is first encoded."""
    for position, word in enumerate(words, 1):
        try:
            word.encode("utf-8")
        except UnicodeEncodeError:
            parser.error(f"argument {position} is not UTF-8 text: {os.fsencode(word)!r}")


def _redis_failure(exc: Exception) -> str:
    said = str(exc) or "no answer"
    return f"{type(exc).__name__}: {said}; what was not committed is done again on the next start"


def _reader_left() -> int:
    """Whoever read stdout closed it (``rhumbatron feed P | head -1``): stop quietly, as a shell
    tool killed by SIGPIPE does, with its exit code (128 + 13)."""
    # Python flushes stdout once more at exit; pointed at /dev/null, that flush cannot fail.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return 128 + signal.SIGPIPE


if __name__ == "__main__":
    sys.exit(main())
