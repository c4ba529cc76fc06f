"""Built-in handlers for drills, the demo and the benchmark (``rhumbatron worker --handler NAME``),
installed under the entry-point group ``rhumbatron.handlers`` like any team's handler:

- ``ok``: every command succeeds; does nothing else (the runtime's own cost);
- ``drill``: obeys ``payload.drill`` — ``"fail"`` fails every attempt (so the command is
  dead-lettered), ``"fail-once"`` fails the first attempt only, ``"more-work"`` asks for another
  delivery every time (the last delivery is acknowledged); anything else succeeds. Every run is
  counted in Redis (``drill:<queue>:runs``) and each success's attempt kept
  (``drill:<queue>:ok``), so a test can check exactly-once success and attempt counts;
- ``flaky``: like ``ok``, but fails the first attempt of one command in ten (by its id's hash).
"""

from __future__ import annotations

import hashlib
from typing import ClassVar

import redis

from router.workers.model import Context, QueueHandler
from router.workers.stores import prefix
from streams.envelopes import Command
from streams.errors import HandlerDrillFailure, MoreWork


class OkHandler(QueueHandler):
    name: ClassVar[str] = "ok"

    def handle(self, command: Command, ctx: Context) -> str | None:
        return None


class FlakyHandler(QueueHandler):
    name: ClassVar[str] = "flaky"

    def handle(self, command: Command, ctx: Context) -> str | None:
        if ctx.attempt == 1 and fails_once(command.command_id):
            raise HandlerDrillFailure(f"flaky: first attempt of {command.command_id} fails")
        return None


def fails_once(command_id: str) -> bool:
    """One command id in ten, by hash: the ``flaky`` handler's first-attempt failures."""
    return hashlib.sha256(command_id.encode()).digest()[0] % 10 == 0


class DrillHandler(QueueHandler):
    name: ClassVar[str] = "drill"

    def __init__(
        self, client: redis.Redis[bytes] | None = None, *, env: str = "", queue: str = ""
    ) -> None:
        if client is not None:
            self.setup(queue, env, client)

    def setup(self, queue: str, env: str, client: redis.Redis[bytes]) -> None:
        self.client = client
        self.runs_key = f"{prefix(env)}drill:{queue}:runs"
        self.ok_key = f"{prefix(env)}drill:{queue}:ok"

    def handle(self, command: Command, ctx: Context) -> str | None:
        self.client.hincrby(self.runs_key, command.command_id, 1)
        mode = command.payload.get("drill")
        if mode == "fail":
            raise HandlerDrillFailure(f"drill: {command.command_id} fails on every attempt")
        if mode == "fail-once" and ctx.attempt == 1:
            raise HandlerDrillFailure(f"drill: {command.command_id} fails on its first attempt")
        if mode == "more-work":
            raise MoreWork()
        self.client.hset(self.ok_key, command.command_id, str(ctx.attempt))
        return None


def read_drill(client: redis.Redis[bytes], env: str, queue: str) -> dict[str, dict[str, int]]:
    """``{"runs": {command_id: runs}, "ok": {command_id: attempt that succeeded}}``."""
    base = f"{prefix(env)}drill:{queue}:"
    return {
        part: {k.decode(): int(v) for k, v in client.hgetall(base + part).items()}
        for part in ("runs", "ok")
    }
