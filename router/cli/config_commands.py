"""``rhumbatron config show``: the effective settings, every secret masked, and where each value
came from (its environment variable, the config file, or the default)."""

from __future__ import annotations

import argparse
import json

from router.cli.common import print_json
from router.settings import Settings, config_file, shown, sources


def config_show(settings: Settings, args: argparse.Namespace) -> int:
    values, origins = shown(settings), sources(settings)
    if args.json:
        print_json(
            {
                "config_file": str(config_file()) if config_file() else None,
                "settings": {n: {"value": v, "source": origins[n]} for n, v in values.items()},
            }
        )
        return 0
    path = config_file()
    print(f"config file: {path if path else 'none (set RHUMBATRON_CONFIG or --config)'}")
    rows = [(name, _text(value), origins[name]) for name, value in values.items()]
    width = max(len(name) for name, _, _ in rows)
    print(f"{'SETTING':<{width}}  {'VALUE':<40}  SOURCE")
    for name, text, origin in rows:
        print(f"{name:<{width}}  {text:<40}  {origin}")
    return 0


def _text(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    config = sub.add_parser(
        "config", help="the effective settings and where each came from"
    ).add_subparsers(dest="action", required=True)
    p = config.add_parser("show", help="every setting, its value (secrets masked) and its source")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(handler=config_show)
