"""``acme-processors init-db``: create the tables of the team's SQL subscription
(:data:`acme_processors.history.SCHEMA`) in its database. Idempotent; run it after
``rhumbatron provision`` (which creates the runtime's own tables there) and before the first
``acme-task-history`` member starts, and again after an upgrade of this package."""

from __future__ import annotations

import argparse
import os
import sys

import psycopg

from acme_processors.history import SCHEMA, TaskHistory

# The variable rhumbatron reads [subscriptions.acme-task-history] database from: the one setting,
# wherever the subscription's members read it.
DATABASE_VARIABLE = "RHUMBATRON_SUBSCRIPTIONS__ACME_TASK_HISTORY__DATABASE"


def init_db(url: str) -> None:
    """Run :data:`SCHEMA` in the first schema of the URL's search_path."""
    with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
        conn.execute(SCHEMA)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="acme-processors")
    commands = parser.add_subparsers(dest="command", required=True)
    init = commands.add_parser(
        "init-db", help=f"create the tables {TaskHistory.slug} writes (idempotent)"
    )
    init.add_argument(
        "--database",
        default=os.environ.get(DATABASE_VARIABLE),
        help=f"its PostgreSQL URL (default: ${DATABASE_VARIABLE})",
    )
    args = parser.parse_args(argv)
    if not args.database:
        print(
            f"acme-processors: init-db needs the database: --database URL, or set "
            f"{DATABASE_VARIABLE} as the subscription's members have it",
            file=sys.stderr,
        )
        return 2
    try:
        init_db(args.database)
    except psycopg.Error as exc:
        print(f"acme-processors: init-db failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(f"acme-processors: {TaskHistory.slug}'s tables are in place")
    return 0


if __name__ == "__main__":
    sys.exit(main())
