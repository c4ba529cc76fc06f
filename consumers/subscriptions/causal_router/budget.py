"""The causal router's daily caps, counted in Redis so every router process shares them.

- :class:`DailyCounter` — ``incr(name)``: classifier calls per day. An ``INCR`` on
  ``rh:<env>:causal-router:<name>`` (the name carries the day) with a TTL past the day's end.
- :class:`CommandBudget` — ``admit(project, change, day, command_id)``: at most ``cap`` commands
  per change per day. A set of the admitted command ids per (project, change, day), checked and
  added in one Lua script: a command id admitted once is admitted again (a retried batch re-emits
  the same ids, and they are not counted twice); a new id is admitted while the set holds fewer
  than ``cap``. Commands with no change (``index.build`` for a project) count under the project.

Both are asked outside the runtime's fenced commit, not as Redis effects of the batch: they must be
shared *before* the batch commits, across processes (the classifier's count by ``process``, the
commands of a partition batch all at once by the router's ``finish_batch``). So a batch that fails
after deciding has counted already; if its retry decides differently (a classifier answered
otherwise), the first decision's count stays. The caps can only run high, never low.

The in-memory implementations serve unit tests (two processors sharing one instance behave as two
processes sharing Redis).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Protocol

import redis

from consumers.redis_conn import Script, run_script_calls

_ADMIT = """
if redis.call('SISMEMBER', KEYS[1], ARGV[1]) == 1 then return 1 end
if redis.call('SCARD', KEYS[1]) >= tonumber(ARGV[2]) then return 0 end
redis.call('SADD', KEYS[1], ARGV[1])
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[3]))
return 1
"""


Admission = tuple[str, str | None, str, str]  # (project id, change id, day, command id)


class DailyCounter(Protocol):
    def incr(self, name: str) -> int:
        """Add one to the counter ``name`` and return its new value."""


class CommandBudget(Protocol):
    def admit(self, project_id: str, change_id: str | None, day: str, command_id: str) -> bool:
        """May this command be sent? True for an id already admitted for this change and day."""

    def admit_all(self, commands: Sequence[Admission]) -> list[bool]:
        """``admit`` for each (project id, change id, day, command id), in order: the same
        answers as one call each, in one round trip."""


def _namespace(env: str) -> str:
    return f"rh:{env}:causal-router:"


class RedisDailyCounter:
    def __init__(self, client: redis.Redis[bytes], *, env: str, ttl_s: int) -> None:
        self.client = client
        self.prefix = _namespace(env)
        self.ttl_s = ttl_s

    def incr(self, name: str) -> int:
        key = self.prefix + name
        pipe = self.client.pipeline()
        pipe.incr(key)
        pipe.expire(key, self.ttl_s)
        count, _ = pipe.execute()
        return int(count)


class RedisCommandBudget:
    def __init__(self, client: redis.Redis[bytes], *, env: str, cap: int, ttl_s: int) -> None:
        self.client = client
        self.prefix = _namespace(env) + "commands:"
        self.cap = cap
        self.ttl_s = ttl_s
        self._admit = Script(_ADMIT)

    def key(self, project_id: str, change_id: str | None, day: str) -> str:
        # Length-prefixed, so no (project, change) pair can spell another's key.
        return f"{self.prefix}{day}:{len(project_id)}:{project_id}|{change_id or ''}"

    def admit(self, project_id: str, change_id: str | None, day: str, command_id: str) -> bool:
        return self.admit_all([(project_id, change_id, day, command_id)])[0]

    def admit_all(self, commands: Sequence[Admission]) -> list[bool]:
        # One call of the script per command, all in one round trip, not one script over every
        # key: each change's set keeps its own key (and hash slot), and the answers are the same
        # as one call after another.
        calls: list[tuple[Sequence[str | bytes], Sequence[str | bytes | int]]] = [
            ([self.key(project_id, change_id, day)], [command_id, self.cap, self.ttl_s])
            for project_id, change_id, day, command_id in commands
        ]
        return [bool(ok) for ok in run_script_calls(self.client, self._admit, calls)]

    def used(self, project_id: str, change_id: str | None, day: str) -> int:
        return int(self.client.scard(self.key(project_id, change_id, day)))


class MemoryDailyCounter:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counts: dict[str, int] = {}

    def incr(self, name: str) -> int:
        with self._lock:
            self.counts[name] = self.counts.get(name, 0) + 1
            return self.counts[name]


class MemoryCommandBudget:
    def __init__(self, cap: int) -> None:
        self.cap = cap
        self._lock = threading.Lock()
        self.admitted: dict[tuple[str, str | None, str], set[str]] = {}

    def admit(self, project_id: str, change_id: str | None, day: str, command_id: str) -> bool:
        with self._lock:
            ids = self.admitted.setdefault((project_id, change_id, day), set())
            if command_id in ids:
                return True
            if len(ids) >= self.cap:
                return False
            ids.add(command_id)
            return True

    def admit_all(self, commands: Sequence[Admission]) -> list[bool]:
        return [self.admit(*admission) for admission in commands]
