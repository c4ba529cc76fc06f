"""Command queues: the worker runtime teams write queue consumers with, helpers for the known
consumers (indexer, workflow starts, agent wakes), and the dead-letter consumer. See
docs/queues.md for the design and why retry topics with a due time were chosen over share
groups."""

from router.workers.model import CommandHandler, Context, QueueHandler, WorkerPolicy
from router.workers.worker import Worker, WorkerStats

__all__ = [
    "CommandHandler",
    "Context",
    "QueueHandler",
    "Worker",
    "WorkerPolicy",
    "WorkerStats",
]
