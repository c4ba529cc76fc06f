"""Handlers for the known consumers, on the worker runtime:

- **indexing** (:class:`IndexingHandler`): runs the team's build function; a command whose last
  attempt failed (or that expired) is recorded with the project's index state — a small Redis
  hash per project (status, error, command id, at, attempts) — instead of being dead-lettered;
- **workflow starts** (:class:`WorkflowStartHandler`, ``verification.start`` / ``release.start``):
  the idempotency key (candidate id, release id) is the instance id in a small workflow-instance
  registry in Redis (start-if-absent), so a redelivery finds the running instance and reports
  ``already_running``;
- **agent wakes** (:class:`AgentWakeHandler`): re-checks relevance with the agent's predicate and
  ends a stale wake at once as a ``false_wakeup`` — an outcome the worker counts in its stats and
  in Redis (``rh:<env>:{workers}:metrics:agent-wakeups``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import ClassVar, Protocol

import orjson
import redis

from router.workers.model import Context, QueueHandler
from router.workers.stores import prefix
from streams.catalog import CATALOG
from streams.envelopes import Command, format_time
from streams.errors import CommandExpired

log = logging.getLogger("rhumbatron.worker")


# -- indexing ----------------------------------------------------------------------------------
class IndexStates(Protocol):
    def record(self, project_id: str, fields: dict[str, str]) -> None: ...

    def get(self, project_id: str) -> dict[str, str]: ...


class RedisIndexStates:
    def __init__(self, client: redis.Redis[bytes], *, env: str) -> None:
        self.client = client
        self.prefix = prefix(env) + "index:"

    def record(self, project_id: str, fields: dict[str, str]) -> None:
        key = self.prefix + project_id
        pipe = self.client.pipeline(transaction=True)
        pipe.delete(key)  # a success clears the last failure's error
        pipe.hset(key, mapping=fields)  # type: ignore[arg-type]
        pipe.execute()

    def get(self, project_id: str) -> dict[str, str]:
        raw = self.client.hgetall(self.prefix + project_id)
        return {k.decode(): v.decode() for k, v in raw.items()}


class MemoryIndexStates:
    def __init__(self) -> None:
        self.states: dict[str, dict[str, str]] = {}

    def record(self, project_id: str, fields: dict[str, str]) -> None:
        self.states[project_id] = dict(fields)

    def get(self, project_id: str) -> dict[str, str]:
        return dict(self.states.get(project_id, {}))


BuildIndex = Callable[[Command, Context], None]


class IndexingHandler(QueueHandler):
    name: ClassVar[str] = "indexer"

    def __init__(self, build: BuildIndex, states: IndexStates) -> None:
        self.build = build
        self.states = states

    def handle(self, command: Command, ctx: Context) -> str | None:
        self.build(command, ctx)
        self.states.record(command.project_id, self._fields("ok", command, ctx, ""))
        return "indexed"

    def on_exhausted(self, command: Command, ctx: Context, error: BaseException) -> bool:
        status = "expired" if isinstance(error, CommandExpired) else "failed"
        text = f"{type(error).__name__}: {error}"
        self.states.record(command.project_id, self._fields(status, command, ctx, text))
        log.warning("indexing: %s for project %s: %s", status, command.project_id, text)
        return True

    @staticmethod
    def _fields(status: str, command: Command, ctx: Context, error: str) -> dict[str, str]:
        return {
            "status": status,
            "error": error,
            "command_id": command.command_id,
            "command_type": command.command_type,
            "attempts": str(ctx.attempt),
            "at": format_time(ctx.now),
        }


# -- workflow starts ---------------------------------------------------------------------------
STARTING = "starting"
RUNNING = "running"

# command type -> (workflow kind, the payload field holding the idempotency key)
WORKFLOW_STARTS: dict[str, tuple[str, str]] = {
    "verification.start": ("verification", "candidateId"),
    "release.start": ("release", "releaseId"),
}


@dataclass(frozen=True)
class WorkflowInstance:
    kind: str
    instance_id: str
    command_id: str
    status: str
    started_at: str


class WorkflowRegistry(Protocol):
    def start(self, instance: WorkflowInstance) -> WorkflowInstance:
        """Create the instance if absent; return the one registered (ours or the earlier)."""

    def mark_running(self, kind: str, instance_id: str) -> None: ...

    def get(self, kind: str, instance_id: str) -> WorkflowInstance | None: ...


class RedisWorkflowRegistry:
    def __init__(self, client: redis.Redis[bytes], *, env: str, ttl_s: int) -> None:
        self.client = client
        self.prefix = prefix(env) + "workflow:"
        self.ttl_s = ttl_s

    def _key(self, kind: str, instance_id: str) -> str:
        return f"{self.prefix}{kind}:{instance_id}"

    def start(self, instance: WorkflowInstance) -> WorkflowInstance:
        key = self._key(instance.kind, instance.instance_id)
        if self.client.set(key, orjson.dumps(asdict(instance)), nx=True, ex=self.ttl_s):
            return instance
        found = self.get(instance.kind, instance.instance_id)
        return found if found is not None else self.start(instance)  # expired in between

    def mark_running(self, kind: str, instance_id: str) -> None:
        found = self.get(kind, instance_id)
        if found is not None:
            running = WorkflowInstance(**{**asdict(found), "status": RUNNING})
            self.client.set(self._key(kind, instance_id), orjson.dumps(asdict(running)), xx=True)

    def get(self, kind: str, instance_id: str) -> WorkflowInstance | None:
        raw = self.client.get(self._key(kind, instance_id))
        return WorkflowInstance(**orjson.loads(raw)) if raw else None


class MemoryWorkflowRegistry:
    def __init__(self) -> None:
        self.instances: dict[tuple[str, str], WorkflowInstance] = {}
        self._lock = threading.Lock()

    def start(self, instance: WorkflowInstance) -> WorkflowInstance:
        with self._lock:
            return self.instances.setdefault((instance.kind, instance.instance_id), instance)

    def mark_running(self, kind: str, instance_id: str) -> None:
        # As in Redis (SET ... XX): an instance that is not there (expired) is not created.
        with self._lock:
            found = self.instances.get((kind, instance_id))
            if found is not None:
                self.instances[(kind, instance_id)] = WorkflowInstance(
                    **{**asdict(found), "status": RUNNING}
                )

    def get(self, kind: str, instance_id: str) -> WorkflowInstance | None:
        return self.instances.get((kind, instance_id))


StartWorkflow = Callable[[WorkflowInstance, Command], None]


class WorkflowStartHandler(QueueHandler):
    """Starts a workflow once per idempotency key. The instance is registered *starting* before
    ``start`` runs and *running* after: a redelivery of the same command that finds it still
    starting (the earlier delivery failed mid-start) runs ``start`` again — which must accept a
    repeat of the same instance id — while any delivery that finds it running reports
    ``already_running``."""

    name: ClassVar[str] = "workflow-start"

    def __init__(self, registry: WorkflowRegistry, start: StartWorkflow) -> None:
        self.registry = registry
        self.start = start

    def handle(self, command: Command, ctx: Context) -> str | None:
        if command.command_type not in WORKFLOW_STARTS:
            raise ValueError(
                f"{command.command_id}: {command.command_type!r} starts no workflow; known: "
                f"{', '.join(sorted(WORKFLOW_STARTS))}"
            )
        kind, field = WORKFLOW_STARTS[command.command_type]
        # The catalog's model checks the key (names the field when it is missing or blank).
        payload = CATALOG.check_payload("Command", command.command_type, None, command.payload)
        if payload is None:
            raise ValueError(f"{command.command_type!r} is not in the catalog (docs/catalog.md)")
        instance_id = str(payload.model_dump(by_alias=True)[field])
        mine = WorkflowInstance(kind, instance_id, command.command_id, STARTING, _at(ctx.now))
        found = self.registry.start(mine)
        if found.status == RUNNING or found.command_id != command.command_id:
            log.info(
                "%s workflow %s already running (started by %s); %s acknowledged",
                kind,
                instance_id,
                found.command_id,
                command.command_id,
            )
            return "already_running"
        self.start(found, command)
        self.registry.mark_running(kind, instance_id)
        return "started"


def _at(now: datetime) -> str:
    return format_time(now)


# -- agent wakes -------------------------------------------------------------------------------
Relevance = Callable[[Command], bool]
Wake = Callable[[Command, Context], None]


class AgentWakeHandler(QueueHandler):
    """``is_relevant`` is the agent's own check (does it still hold or need the task?)."""

    name: ClassVar[str] = "agent-wake"

    def __init__(self, is_relevant: Relevance, wake: Wake) -> None:
        self.is_relevant = is_relevant
        self.wake = wake

    def handle(self, command: Command, ctx: Context) -> str | None:
        if not self.is_relevant(command):
            log.info("agent.wake %s is stale: a false wakeup, ended at once", command.command_id)
            return "false_wakeup"
        self.wake(command, ctx)
        return "woken"
