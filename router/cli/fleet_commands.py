"""``rhumbatron fleet``: the whole router as one supervised set of processes (router/fleet.py),
and ``rhumbatron fleet status``: its members, their pids, restarts, partitions and lag."""

from __future__ import annotations

import argparse
import importlib.metadata
import time
from pathlib import Path

import yaml

from router import deploy, fleet
from router.cli.common import print_json, stop_on_signals
from router.settings import Settings, settings_elsewhere
from streams.errors import ConfigurationError


def run(settings: Settings, args: argparse.Namespace) -> int:
    if args.fleet_command is not None:
        return int(args.fleet_handler(settings, args))
    stop = stop_on_signals()
    members = fleet.plan(settings, args.outbox or ())
    if not members:
        raise ConfigurationError("the fleet has no members: its settings ask for none")
    path = fleet.status_path(settings)
    running = fleet.read_status(path)
    if (
        running is not None
        and running.state in ("running", "stopping")
        and fleet.alive(running.pid)
    ):
        raise ConfigurationError(
            f"a fleet of environment {settings.env!r} already runs (pid {running.pid}, {path})"
        )
    supervisor = fleet.Supervisor(settings, members, status_file=path)
    print(
        f"fleet of {settings.env!r}: {len(members)} members "
        f"({', '.join(m.name for m in members)}); status: {path}",
        flush=True,
    )
    code = supervisor.run(stop)
    print(f"fleet of {settings.env!r}: {supervisor.status.state}", flush=True)
    return code


def status(settings: Settings, args: argparse.Namespace) -> int:
    found, owned = fleet.current(settings)
    if found is None:
        path = fleet.status_path(settings)
        raise ConfigurationError(f"no fleet of environment {settings.env!r} has run here ({path})")
    if args.json:
        out = found.as_dict()
        for member in out["members"]:
            got = owned.get(member["name"])
            member["partitions"] = got.partitions if got else None
            member["lag"] = got.lag if got else None
        print_json(out)
    else:
        age = time.time() - found.updated_at
        print(f"fleet of {found.env!r}: {found.state}, pid {found.pid}, updated {age:.0f} s ago")
        print(f"{'member':32} {'state':9} {'pid':>8} {'restarts':>8} {'partitions':>10} {'lag':>8}")
        for m in found.members:
            got = owned.get(m.name)
            print(
                f"{m.name:32} {m.state:9} {m.pid or '-':>8} {m.restarts:>8} "
                f"{len(got.partitions) if got else '-':>10} {got.lag if got else '-':>8}"
            )
    return 0 if found.state in ("running", "stopped") else 1


def manifests(settings: Settings, args: argparse.Namespace) -> int:
    path = Path(args.settings_file).absolute()
    deployment = settings_elsewhere(path)  # its pods', not this shell's
    docs = deploy.manifests(
        deployment, path.read_text(encoding="utf-8"), image=args.image, namespace=args.namespace
    )
    print(
        f"# rhumbatron fleet manifests {path.name} --image {args.image} --namespace {args.namespace}"
    )
    print(f"# from {path.name}; apply after creating, in namespace {args.namespace}:")
    print(f"#   Secret {deploy.APP}-secrets, keys (each optional): {', '.join(deploy.SECRET_KEYS)}")
    print(f"#     and for KEDA's Kafka scaler: {', '.join(deploy.KEDA_SECRET_KEYS)}")
    print(f"#   Secret {deploy.APP}-tls (optional): the CA and client files the settings name")
    print(f"#   under {deploy.CONFIG_DIR}/tls/")
    print(yaml.safe_dump_all(docs, sort_keys=False, width=100), end="")
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "fleet",
        help="run the whole router as supervised processes (docs/operations.md)",
        description="Runs the members its settings name (fleet_* settings; --config for a file): "
        "the publishers, the pump, each subscription's processes, the workers, the dead-letter "
        "consumer, the analytics rollup and the operator server. A member that exits is "
        "restarted with backoff; SIGTERM or SIGINT stops each gracefully, within "
        "fleet_stop_timeout_s.",
    )
    p.add_argument(
        "--config",
        default=argparse.SUPPRESS,
        metavar="PATH",
        help="a TOML file of settings (the same as rhumbatron --config PATH)",
    )
    p.add_argument(
        "--outbox",
        action="append",
        metavar="PATH_OR_URL",
        help="run a publisher for this outbox too (repeatable), beside fleet_outboxes",
    )
    p.set_defaults(handler=run, fleet_command=None)
    commands = p.add_subparsers(dest="fleet_command")
    s = commands.add_parser(
        "status", help="the fleet's members: state, pid, restarts, partitions and lag"
    )
    s.add_argument("--json", action="store_true", help="print JSON")
    s.set_defaults(fleet_handler=status)
    m = commands.add_parser(
        "manifests",
        help="the fleet as Kubernetes manifests, from its settings file (docs/operations.md)",
        description="Prints the manifests of the fleet the settings describe: a Deployment "
        "(StatefulSet with fleet_static_membership) per subscription with its "
        "PodDisruptionBudget and KEDA ScaledObject, one workload per other member, the "
        "ConfigMap carrying the settings file (read alone: no RHUMBATRON_* variable of "
        "this shell goes into it).",
    )
    m.add_argument("settings_file", metavar="SETTINGS.toml", help="the deployment's settings")
    m.add_argument(
        "--image",
        default=f"rhumbatron:{importlib.metadata.version('rhumbatron')}",
        help="the router image (default: this release's)",
    )
    m.add_argument("--namespace", default=deploy.APP, help="the namespace (default: %(default)s)")
    m.set_defaults(fleet_handler=manifests)
