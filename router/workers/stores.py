"""What workers keep in Redis: the completed-command ledger (dedupe by ``command_id``) and the
per-queue counters (handled, retried, dead-lettered, false wakeups …). In-memory twins serve the
unit tests.

Every key lives under ``rh:<env>:{workers}:``. A completed command id is remembered for the queue
retention plus ``command_dedupe_margin_ms``: longer than any copy of it can still be delivered.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Protocol

import redis

from consumers.redis_conn import Script, Wait, run_script_calls


def prefix(env: str) -> str:
    return f"rh:{env}:{{workers}}:"


class CommandLedger(Protocol):
    def done_among(self, command_ids: Iterable[str]) -> set[str]:
        """The ids among these that already completed."""

    def mark_done(
        self, command_ids: Iterable[str], follow_ups: Mapping[str, bytes] | None = None
    ) -> None:
        """Records the ids as completed, each with the follow-up commands its run sent
        (``follow_ups``: id -> packed records, router.workers.outgoing.pack_records)."""

    def follow_ups_of(self, command_ids: Iterable[str]) -> dict[str, bytes]:
        """The packed follow-ups recorded with these completed ids (those that sent any)."""

    def in_flight_among(self, command_ids: Iterable[str]) -> dict[str, str]:
        """Of these ids, those whose retry chain started: id -> where its first copy was read
        (``topic:partition:offset``), or ``ENDED`` and the place it ended at."""

    def track(self, started: Mapping[str, str], ended: Mapping[str, str]) -> None:
        """Records the retry chains ``started`` (id -> its first copy's place) and those
        ``ended`` (completed, dead-lettered, given up: id -> the place of the record it ended
        at, kept as ``ENDED`` + place); one call, before the transaction that starts or ends
        them commits."""


class WorkerMetrics(Protocol):
    def add(self, queue: str, counts: Mapping[str, int]) -> None: ...


# Every key given is set, with the TTL (milliseconds) of ARGV[1], to its value in ARGV[i + 1]:
# "1", or the follow-up commands its run sent, packed.
_MARK_DONE = """
for i, key in ipairs(KEYS) do
  redis.call('SET', key, ARGV[i + 1], 'PX', ARGV[1])
end
return #KEYS
"""
_NONE = b"1"  # a completed command that sent no follow-up

# The in-flight marks: each of KEYS set to its ARGV[i + 1] with the TTL of ARGV[1].
_TRACK = """
for i, key in ipairs(KEYS) do
  redis.call('SET', key, ARGV[i + 1], 'PX', ARGV[1])
end
return #KEYS
"""
# The mark of a command whose retry chain ended (done, dead-lettered, given up) is this prefix
# and the place of the record it ended at: a later copy is a duplicate, unless it is an
# operator's retry of its dead letter (or that record read again, after an aborted transaction).
ENDED = "ended:"


class RedisCommandLedger:
    def __init__(
        self, client: redis.Redis[bytes], *, env: str, ttl_ms: int, wait: Wait | None = None
    ) -> None:
        self.client = client
        self.prefix = prefix(env) + "done:"
        self.ttl_ms = ttl_ms
        # The worker's commit: with a WAIT, a mark fewer replicas acknowledged fails the batch
        # (retried) before its Kafka offsets are committed, so a failover cannot forget it.
        self.wait = wait
        self._mark = Script(_MARK_DONE)
        self._track = Script(_TRACK)
        self.in_flight = prefix(env) + "inflight:"

    def done_among(self, command_ids: Iterable[str]) -> set[str]:
        ids = list(dict.fromkeys(command_ids))
        if not ids:
            return set()
        found = self.client.mget([self.prefix + i for i in ids])
        return {i for i, value in zip(ids, found, strict=True) if value is not None}

    def mark_done(
        self, command_ids: Iterable[str], follow_ups: Mapping[str, bytes] | None = None
    ) -> None:
        """One script call for all of them (the keys share the ``{workers}`` hash slot): a
        command each in a pipeline cost more to pack than the round trip it saved."""
        ids = list(dict.fromkeys(command_ids))
        if not ids:
            return
        sent = follow_ups or {}
        keys = [self.prefix + i for i in ids]
        values: list[int | bytes] = [self.ttl_ms, *(sent.get(i) or _NONE for i in ids)]
        run_script_calls(self.client, self._mark, [(keys, values)], wait=self.wait)

    def in_flight_among(self, command_ids: Iterable[str]) -> dict[str, str]:
        ids = list(dict.fromkeys(command_ids))
        if not ids:
            return {}
        found = self.client.mget([self.in_flight + i for i in ids])
        return {i: v.decode() for i, v in zip(ids, found, strict=True) if v is not None}

    def track(self, started: Mapping[str, str], ended: Mapping[str, str]) -> None:
        marks = {**{i: ENDED + place for i, place in ended.items()}, **started}
        if not marks:
            return
        keys = [self.in_flight + i for i in marks]
        args: list[int | str] = [self.ttl_ms, *marks.values()]
        run_script_calls(self.client, self._track, [(keys, args)], wait=self.wait)

    def follow_ups_of(self, command_ids: Iterable[str]) -> dict[str, bytes]:
        ids = list(dict.fromkeys(command_ids))
        if not ids:
            return {}
        found = self.client.mget([self.prefix + i for i in ids])
        return {i: v for i, v in zip(ids, found, strict=True) if v is not None and v != _NONE}


class MemoryCommandLedger:
    """The ledger in one process, without expiry: a unit test never outlives the retention the
    Redis ledger's TTL covers."""

    def __init__(self) -> None:
        self.done: set[str] = set()
        self.sent: dict[str, bytes] = {}
        self.flying: dict[str, str] = {}

    def done_among(self, command_ids: Iterable[str]) -> set[str]:
        return {i for i in command_ids if i in self.done}

    def mark_done(
        self, command_ids: Iterable[str], follow_ups: Mapping[str, bytes] | None = None
    ) -> None:
        for i in command_ids:
            self.done.add(i)
            if follow_ups and follow_ups.get(i):
                self.sent[i] = follow_ups[i]

    def follow_ups_of(self, command_ids: Iterable[str]) -> dict[str, bytes]:
        return {i: self.sent[i] for i in command_ids if i in self.sent}

    def in_flight_among(self, command_ids: Iterable[str]) -> dict[str, str]:
        return {i: self.flying[i] for i in command_ids if i in self.flying}

    def track(self, started: Mapping[str, str], ended: Mapping[str, str]) -> None:
        for i, place in ended.items():
            self.flying[i] = ENDED + place
        self.flying.update(started)


class RedisWorkerMetrics:
    """Counters per queue in one hash (``metrics:<queue>``), summed across worker processes."""

    def __init__(self, client: redis.Redis[bytes], *, env: str) -> None:
        self.client = client
        self.prefix = prefix(env) + "metrics:"

    def add(self, queue: str, counts: Mapping[str, int]) -> None:
        live = {k: v for k, v in counts.items() if v}
        if not live:
            return
        pipe = self.client.pipeline(transaction=False)
        for name, value in live.items():
            pipe.hincrby(self.prefix + queue, name, value)
        pipe.execute()


class MemoryWorkerMetrics:
    def __init__(self) -> None:
        self.counts: dict[str, Counter[str]] = {}
        self._lock = threading.Lock()

    def add(self, queue: str, counts: Mapping[str, int]) -> None:
        # As in Redis (HINCRBY is skipped for a zero): a counter that only counted zeros, and a
        # queue with nothing else, do not appear.
        live = {k: v for k, v in counts.items() if v}
        if not live:
            return
        with self._lock:
            self.counts.setdefault(queue, Counter()).update(live)


def read_metrics(client: redis.Redis[bytes], env: str) -> dict[str, dict[str, int]]:
    """``{queue: {counter: value}}`` for every queue that counted anything."""
    out: dict[str, dict[str, int]] = {}
    base = prefix(env) + "metrics:"
    for key in client.scan_iter(match=base + "*", count=100):
        queue = key.decode().removeprefix(base)
        out[queue] = {k.decode(): int(v) for k, v in sorted(client.hgetall(key).items())}
    return dict(sorted(out.items()))
