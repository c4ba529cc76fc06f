"""The projection as a faust-streaming agent, beside the project-view-projector (row
``faust-agent``), and faust's own consume rate beside the raw confluent-kafka one (row
``faust-consume``).

``faust-agent``: one faust app, one agent over the environment's stream topics, reading them in
takes of up to 500 records (``stream.take(500, within=0.05)``). Each record is decoded with the
same envelope model (``decode_event``), folded and turned into view updates by the same
processor (``ProjectViewProjector.reduce`` and ``process``), and the ops of a whole take are
written to Redis in one pipeline, each op as plainly as it means (a compare for HMAX and the slot
bookkeeping of SLOT in a two-line Lua script each, as the runtime's commit script does them). No
claims, no cursor, no exactly-once: faust at least once, its fold in memory. That is the point of
the comparison: what the runtime's guarantees cost beside the plain way to write the same views.

``faust-consume``: the same records through the same app shape with nothing done per take but
counting them. Both rates run from the first record to the last (the group join is left out).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import faust
import redis.asyncio as aioredis
from faust.streams import Stream
from faust.types import EventT, StreamT

from bench.harness import FAUST_EVENTS, BenchEnv, case, delete_keys
from bench.rows import Row, rate
from bench.scale_cases import publish_apart
from consumers.redis_conn import connect
from consumers.runtime.types import JSON, TP, Delivery, Phase, RedisOp
from consumers.subscriptions.projector.processor import ProjectViewProjector
from router.settings import Settings
from streams.envelopes import decode_event

PROJECTS = 500
PUBLISHED = "faust-published"  # the marker file in the run's folder
TAKE = 500
TAKE_WITHIN_S = 0.05
RUN_TIMEOUT_S = 1800.0  # a take loop that never reaches its count fails the case

# HMAX and SLOT are read-then-write; a script keeps each atomic, as in the runtime's commit.
HMAX_LUA = """
local c = redis.call('HGET', KEYS[1], ARGV[1])
if (not c) or tonumber(ARGV[2]) > tonumber(c) then redis.call('HSET', KEYS[1], ARGV[1], ARGV[2]) end
"""
SLOT_LUA = """
local slot = tonumber(ARGV[1]); local cap = tonumber(ARGV[2])
local high = tonumber(redis.call('HGET', KEYS[1], 'high') or '0')
if slot > high then
  local n = redis.call('SCARD', KEYS[2])
  for s = high + 1, slot - 1 do
    if n >= cap then redis.call('HSET', KEYS[1], 'missing_overflow', '1'); break end
    redis.call('SADD', KEYS[2], s); n = n + 1
  end
  redis.call('HSET', KEYS[1], 'high', slot)
else
  redis.call('SREM', KEYS[2], slot)
end
"""


@dataclass
class Progress:
    """What the agent counted, and when its first and last records came."""

    expected: int
    records: int = 0
    first: float | None = None
    last: float = 0.0
    done: asyncio.Event = field(default_factory=asyncio.Event)

    def took(self, n: int) -> None:
        now = time.perf_counter()
        if self.first is None:
            self.first = now
        self.records += n
        self.last = now
        if self.records >= self.expected:
            self.done.set()


class ViewWriter:
    """Writes a take's RedisOps in one pipeline, under the environment's faust namespace."""

    def __init__(self, client: aioredis.Redis[bytes], prefix: str) -> None:
        self.client = client
        self.prefix = prefix
        self.hmax = ""
        self.slot = ""

    async def load(self) -> None:
        self.hmax = await self.client.script_load(HMAX_LUA)
        self.slot = await self.client.script_load(SLOT_LUA)

    async def write(self, ops: list[RedisOp]) -> None:
        pipe = self.client.pipeline(transaction=False)
        key = self.prefix.__add__
        for op in ops:
            a = op.args
            match op.op:
                case "HSET":
                    pipe.hset(key(op.key), str(a[0]), str(a[1]))
                case "HINCRBY":
                    pipe.hincrby(key(op.key), str(a[0]), int(a[1]))
                case "HMAX":
                    pipe.evalsha(self.hmax, 1, key(op.key), str(a[0]), str(a[1]))
                case "LPUSHTRIM":
                    pipe.lpush(key(op.key), str(a[0]))
                    pipe.ltrim(key(op.key), 0, int(a[1]) - 1)
                case "SLOT":
                    pipe.evalsha(self.slot, 2, key(op.key), key(str(a[0])), str(a[1]), str(a[2]))
                case _:
                    raise ValueError(f"the faust projection does not write {op.op!r} ops")
        await pipe.execute()


def _app(s: Settings, datadir: str, app_id: str) -> tuple[faust.App, Any]:
    app = faust.App(
        app_id,
        broker=";".join(f"kafka://{b.strip()}" for b in s.kafka_bootstrap.split(",")),
        store="memory://",
        datadir=datadir,
        autodiscover=False,
        processing_guarantee="at_least_once",
        consumer_auto_offset_reset="earliest",
        topic_partitions=s.partitions,
        web_enabled=False,
    )
    topic = app.topic(
        *s.topology.stream_names(),
        key_type=bytes,
        value_type=bytes,
        key_serializer="raw",
        value_serializer="raw",
    )
    return app, topic


def run_agent(
    s: Settings,
    app_id: str,
    expected: int,
    handle: Callable[[Sequence[EventT[Any]]], Awaitable[None]] | None,
) -> Progress:
    """Run one faust worker (its group ``app_id``) whose agent takes ``TAKE`` records at a time
    and passes each take's events to ``handle`` (None: only count them), until ``expected``
    records were taken."""
    progress = Progress(expected)
    with tempfile.TemporaryDirectory(prefix="bench-faust-") as datadir:
        app, topic = _app(s, datadir, app_id)

        @app.agent(topic, name="projection")
        async def projection(stream: StreamT[bytes]) -> None:
            # take_events: take's batches as events, which keep each record's topic and offset.
            takes = cast(Stream[bytes], stream).take_events(TAKE, within=TAKE_WITHIN_S)
            async for events in takes:
                if handle is not None:
                    await handle(events)
                progress.took(len(events))

        async def stop_when_done() -> None:
            try:
                await asyncio.wait_for(progress.done.wait(), RUN_TIMEOUT_S)
            finally:
                # The worker's own way out, as for the rollup: it stops on SIGTERM.
                os.kill(os.getpid(), signal.SIGTERM)

        app.task(stop_when_done)

        # Its output goes to stderr: a case's stdout is the harness's (its result line).
        worker = faust.Worker(
            app, loglevel="warning", quiet=True, redirect_stdouts=False, stdout=sys.stderr
        )
        logging.getLogger("faust").setLevel(logging.WARNING)
        try:
            worker.execute_from_commandline()
        except SystemExit as exc:
            if exc.code not in (0, None):
                raise
    if progress.records < expected:
        raise RuntimeError(f"the faust agent took {progress.records} of {expected} records")
    return progress


def _events(env: BenchEnv) -> int:
    """The events of a faust row: at most FAUST_EVENTS (its rate is timed from its first record
    to its last, so it is steady after a few seconds; 500,000 at faust's ~2,000/s would be four
    minutes a row a round)."""
    return min(env.size, FAUST_EVENTS)


def _published(env: BenchEnv) -> None:
    """The faust rows' environment (``<run>_faust``), its events published by the first faust
    case of the run; each case and round reads them in a group of its own."""
    s = env.scratch["faust"] = Settings(
        **{**env.settings.model_dump(), "env": f"{env.settings.env}_faust"}
    )
    marker = env.run_dir / PUBLISHED
    if not marker.exists():
        publish_apart(s, PROJECTS, _events(env))
        marker.write_text(str(_events(env)))


def _app_id(env: BenchEnv, s: Settings, name: str) -> str:
    return f"bench-{s.env}-{name}-r{env.round}"


def _rate(name: str, env: BenchEnv, p: Progress, vs: str, what: str) -> Row:
    assert p.first is not None
    return rate(
        name,
        p.records,
        p.last - p.first,
        "events/s",
        vs=vs,
        note=f"{p.records} records of {_events(env)} events over {PROJECTS} projects, one faust "
        f"agent (aiokafka), stream.take({TAKE}, within={TAKE_WITHIN_S}); {what}; first record to "
        "last",
    )


@case("faust-agent", setup=_published)
def faust_agent(env: BenchEnv) -> list[Row]:
    s: Settings = env.scratch["faust"]
    processor = ProjectViewProjector(
        feed_length=s.project_feed_length, missing_cap=s.project_view_missing_cap
    )
    states: dict[str, JSON | None] = {}
    client = aioredis.from_url(s.redis_url)
    views = ViewWriter(client, f"rh:{s.env}:faust:")
    loaded: list[bool] = []

    async def project(records: Sequence[EventT[Any]]) -> None:
        if not loaded:
            await views.load()
            loaded.append(True)
        ops: list[RedisOp] = []
        for record in records:
            message = record.message
            event = decode_event(record.value, max_bytes=s.max_envelope_bytes)
            state = processor.reduce(states.get(event.project_id), event)
            states[event.project_id] = state
            delivery = Delivery(
                tp=TP(message.topic, message.partition),
                offset=message.offset,
                phase=Phase.CATCHING_UP,
                caught_up=False,
                cursor_revision=0,
            )
            ops.extend(processor.process(event, state, delivery).redis)
        await views.write(ops)

    try:
        p = run_agent(s, _app_id(env, s, "agent"), _events(env), project)
    finally:
        delete_keys(connect(s.redis_url, timeout=5), f"rh:{s.env}:faust:*")
    return [
        _rate(
            "faust-agent",
            env,
            p,
            "projector",
            "decode_event, the projector's reduce and process, the take's Redis ops in one "
            "pipeline; at least once, no claims or cursor",
        )
    ]


@case("faust-consume", setup=_published)
def faust_consume(env: BenchEnv) -> list[Row]:
    s: Settings = env.scratch["faust"]
    p = run_agent(s, _app_id(env, s, "consume"), _events(env), None)
    return [_rate("faust-consume", env, p, "raw-consume", "records counted, nothing decoded")]
