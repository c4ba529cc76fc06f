"""``rhumbatron acls``: the least-privilege Kafka ACLs and Redis ACL user of each role of the
environment, as derived from the code (``router.wiring.acls``); docs/security.md explains them."""

from __future__ import annotations

import argparse

from router.cli.common import print_json
from router.settings import Settings
from router.wiring.acls import command_lines, principal_of, roles, table_lines
from streams.errors import ConfigurationError
from streams.topology import check_env


def acls(settings: Settings, args: argparse.Namespace) -> int:
    env = settings.env if args.env is None else check_env(args.env)
    if args.principal is not None and args.role is None:
        raise ConfigurationError(
            "--principal names the login of one role: give --role too (without it, each role "
            "gets its own principal, User:rhumbatron-<role>-<env>)"
        )
    if args.principal is not None and not args.principal.startswith("User:"):
        raise ConfigurationError(f"--principal must be User:<name>, got {args.principal!r}")
    chosen = roles(settings, env=env)
    known = [r.name for r in chosen]
    if args.role is not None and args.role not in known:
        # Not argparse's choices: the roles follow the settings' queues and subscriptions.
        raise ConfigurationError(f"--role: unknown role {args.role!r}; known: {', '.join(known)}")
    if args.role is not None:
        chosen = [r for r in chosen if r.name == args.role]
    principal = {r.name: args.principal or principal_of(r.name, env) for r in chosen}
    if args.json:
        print_json(
            {
                "env": env,
                "roles": [{**r.as_dict(), "principal": principal[r.name]} for r in chosen],
            }
        )
        return 0
    render = command_lines if args.commands else table_lines
    blocks = ["\n".join(render(r, principal[r.name])) for r in chosen]
    print("\n\n".join(blocks))
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "acls",
        help="the Kafka ACLs and Redis ACL user each role needs, derived from the code "
        "(docs/security.md)",
    )
    p.add_argument(
        "--role",
        help="one role only (default: every role): provisioner, publisher, a subscription's "
        "slug, analytics-rollup, worker-<queue> for each queue of the settings, pump, operator",
    )
    p.add_argument(
        "--principal",
        metavar="User:NAME",
        help="the role's Kafka principal, whose name is its Redis user too (with --role; "
        "default: User:rhumbatron-<role>-<env>)",
    )
    p.add_argument(
        "--env",
        metavar="ENV",
        help="the environment whose names to use (default: RHUMBATRON_ENV); the plan (streams, "
        "queue policies) is the settings'",
    )
    p.add_argument(
        "--commands",
        action="store_true",
        help="print the kafka-acls.sh --add and redis-cli ACL SETUSER lines instead of tables",
    )
    p.add_argument("--json", action="store_true", help="print JSON, with each grant's reason")
    p.set_defaults(handler=acls)
