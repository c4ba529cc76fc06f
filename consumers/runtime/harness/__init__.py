"""The in-memory harness: the world the runtime's own property tests run subscriptions in, and
what a processor's author tests with (``rhumbatron.testing`` offers it).

- :mod:`.events`: valid events for tests;
- :mod:`.world`: the world (log, store, dead letters, clock) and runners over it;
- :mod:`.run`: one run of a processor over a list of events; :mod:`.result`: what it left;
- :mod:`.check`: the exactly-once check, the same events replayed every way that must not
  matter.
"""

from __future__ import annotations

from consumers.runtime.harness.check import Trial, assert_exactly_once
from consumers.runtime.harness.events import event
from consumers.runtime.harness.result import (
    Applied,
    CaughtUpCall,
    DeadLettered,
    PartitionCursor,
    Result,
)
from consumers.runtime.harness.run import run
from consumers.runtime.harness.world import (
    BOUNDARIES,
    HARNESS_OUTBOX,
    LIMIT,
    OUT,
    PARTITIONS,
    PROJECTS_SHARING,
    REDELIVERY,
    STREAMS,
    Crash,
    World,
    partition_of,
)
from streams.errors import EffectsDiverged

__all__ = [
    "BOUNDARIES",
    "HARNESS_OUTBOX",
    "LIMIT",
    "OUT",
    "PARTITIONS",
    "PROJECTS_SHARING",
    "REDELIVERY",
    "STREAMS",
    "Applied",
    "CaughtUpCall",
    "Crash",
    "DeadLettered",
    "EffectsDiverged",
    "PartitionCursor",
    "Result",
    "Trial",
    "World",
    "assert_exactly_once",
    "event",
    "partition_of",
    "run",
]
