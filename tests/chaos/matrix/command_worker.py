"""A command worker whose handler keeps the matrix's independent record of the command side:
``python -m tests.chaos.matrix.command_worker --queue PURPOSE [--until-idle S]``, settings from
the environment like ``rhumbatron worker``'s (the worker runtime is the product's, only the
handler is the matrix's).

The handler appends every start, failure and completion to one Redis list per environment
(``RPUSH``: append-only, no unique key, so a second run of one attempt shows as a second
``start``), with the attempt, the wall time and the process. The list and the handler's effects
live in the shared test Redis (``JOURNAL_ENV``), not the row's: a row that kills, cuts off,
empties or restores its own Redis must not change the record it is checked against, nor an
effect a real handler would have made in a system of its own. Its effect is idempotent on the
command id (``SET NX``), as a real handler's idempotency key makes it: a ``done`` entry says
whether it was the first (``first``) — a worker killed between its handler and its commit runs
the handler again, and the record then shows both starts and one first completion.

Which commands fail is decided by :class:`Failures` from the command id alone, so the checks
compute the same answer: some fail their first attempt, some their first two, some every attempt
(only on queues with a dead-letter queue, where they must land after exactly ``1 + retries``
runs).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

import orjson
import redis

from router.cli.common import stop_on_signals
from router.cli.logs import configure
from router.cli.worker_commands import worker_summary
from router.settings import Settings
from router.wiring.subscription import redis_client
from router.wiring.workers import open_worker
from router.workers.model import Context, QueueHandler
from streams.envelopes import Command
from streams.errors import HandlerDrillFailure
from streams.topology import QUEUE_PURPOSES

# The failure rule of a row, as JSON (Failures.as_env): the worker processes read it here.
FAILURES_ENV = "RHUMBATRON_TEST_COMMAND_FAILURES"
ALWAYS = -1  # Failures.of: the command fails every attempt


@dataclass(frozen=True, slots=True)
class Failures:
    """Which commands fail, by their id's hash: ``once`` of them fail their first attempt,
    ``twice`` their first two, ``always`` every attempt (fractions of the commands)."""

    once: float = 0.0
    twice: float = 0.0
    always: float = 0.0

    def of(self, command_id: str, *, dead_letter: bool) -> int:
        """How many attempts of this command fail (ALWAYS: all). ``dead_letter``: its queue has
        a dead-letter queue (a command failing every attempt on one without is only logged)."""
        bucket = int.from_bytes(hashlib.sha256(command_id.encode()).digest()[:4]) / 2**32
        if bucket < self.once:
            return 1
        if bucket < self.once + self.twice:
            return 2
        if bucket < self.once + self.twice + self.always and dead_letter:
            return ALWAYS
        return 0

    def as_env(self) -> str:
        return orjson.dumps(asdict(self)).decode()

    @classmethod
    def from_env(cls) -> Failures:
        raw = os.environ.get(FAILURES_ENV)
        return cls(**orjson.loads(raw)) if raw else cls()


# The Redis of the journal and the handler's effects (the shared test Redis; the matrix sets it).
JOURNAL_ENV = "RHUMBATRON_TEST_JOURNAL_REDIS"


def journal_client(settings: Settings) -> redis.Redis[bytes]:
    url = os.environ.get(JOURNAL_ENV)
    if url is None:
        return redis_client(settings)
    return redis_client(settings.model_copy(update={"redis_url": url}))


def journal_key(env: str) -> str:
    return f"rh:{env}:{{chaos}}:journal"


def effect_key(env: str, command_id: str) -> str:
    return f"rh:{env}:{{chaos}}:effect:{command_id}"


@dataclass(frozen=True, slots=True)
class Entry:
    """One line of the journal."""

    what: str  # start | fail | done, or assigned: the worker's partitions changed
    command_id: str
    queue: str
    attempt: int
    at_ms: int  # wall clock, as the worker's due times are
    pid: int
    first: bool = False  # done: this completion made the effect
    partitions: list[str] = field(default_factory=list)  # assigned: what it holds now


def read_journal(client: redis.Redis[bytes], env: str) -> list[Entry]:
    return [Entry(**orjson.loads(raw)) for raw in client.lrange(journal_key(env), 0, -1)]


class JournalHandler(QueueHandler):
    name: ClassVar[str] = "chaos-journal"

    def __init__(
        self, client: redis.Redis[bytes], *, env: str, queue: str, dead_letter: bool
    ) -> None:
        self.client = client
        self.env = env
        self.queue = queue
        self.dead_letter = dead_letter
        self.failures = Failures.from_env()
        self.pid = os.getpid()

    def _append(self, what: str, command: Command, ctx: Context, **extra: Any) -> None:
        entry = Entry(
            what, command.command_id, self.queue, ctx.attempt, int(time.time() * 1000), self.pid
        )
        line = orjson.dumps({**asdict(entry), **extra})
        self.client.rpush(journal_key(self.env), line)

    def handle(self, command: Command, ctx: Context) -> str | None:
        self._append("start", command, ctx)
        fails = self.failures.of(command.command_id, dead_letter=self.dead_letter)
        if fails == ALWAYS or ctx.attempt <= fails:
            # Recorded before the raise: the retry's due time is taken after it, so a retry
            # started earlier than this plus the delay ran early.
            self._append("fail", command, ctx)
            raise HandlerDrillFailure(
                f"chaos: {command.command_id} fails attempt {ctx.attempt} by the row's rule"
            )
        first = bool(
            self.client.set(effect_key(self.env, command.command_id), ctx.attempt, nx=True)
        )
        self._append("done", command, ctx, first=first)
        return None if first else "already_done"


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos.matrix.command_worker")
    parser.add_argument("--queue", required=True, choices=QUEUE_PURPOSES)
    parser.add_argument("--until-idle", type=float)
    args = parser.parse_args()
    configure(verbose=True)
    settings = Settings()
    stop = stop_on_signals()
    client = redis_client(settings)
    journal = journal_client(settings)
    handler = JournalHandler(
        journal,
        env=settings.env,
        queue=args.queue,
        dead_letter=settings.queues[args.queue].dead_letter is not None,
    )
    process = open_worker(settings, args.queue, handler, client=client)
    print(f"worker {args.queue}: ready", file=sys.stderr, flush=True)
    held: set[str] = set()

    def tick() -> None:
        process.tick()
        # Each change of what this member holds, in the journal beside the attempts: a row
        # can tell which retries waited through a rebalance.
        now = {f"{tp.topic}[{tp.partition}]" for tp in process.worker.transport.assignment()}
        if now != held:
            held.clear()
            held.update(now)
            entry = Entry("assigned", "", args.queue, 0, int(time.time() * 1000), os.getpid())
            line = {**asdict(entry), "partitions": sorted(now)}
            journal.rpush(journal_key(settings.env), orjson.dumps(line))
            print(f"worker {args.queue}: assigned {sorted(now)}", file=sys.stderr, flush=True)

    try:
        stats = process.worker.run(until_idle_s=args.until_idle, should_stop=stop.is_set, tick=tick)
    finally:
        process.close()
    print(worker_summary(f"worker {args.queue}", stats), file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
