"""Row 22: an operator's moves under load, through the command line, while each partition's owner
runs — and what they change in what the checks expect.

The moves (:class:`Operator`, a thread beside the supervised pipeline):

1. ``subscription skip-through`` past the ledger's drill event: the row runs the ledger under the
   ``block`` failure policy, so the event fails for ever and holds its partition's cursor until
   an operator skips it (the escape docs/processors.md gives that policy);
2. ``subscription reprocess-from`` half-way back on another ledger partition, with the revision
   it read: the events from there on run their effects again at the next cursor revision;
3. ``subscription re-reduce`` of a project-view-projector partition: its fold rebuilt while the
   owner applies, no effect run (the views must still equal the plain replay's).

What the checks expect afterwards (:func:`audited`), read from the audit logs, not from the row:
an event at an offset an audited skip-through covered is accounted for, not lost (I1), and is not
owed a dead letter (I3); an event at an offset a reprocess_from re-ran is applied once more, once,
at the revision the audit names (I2), its project's effects being its slots in order and then the
re-run slots in order (I4). Each is checked from the ledger's append-only record (its revision
record names the revision of each re-run).
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from consumers.runtime.controls import RedisAuditLog
from consumers.runtime.kafka_transport import KafkaReader
from consumers.runtime.types import TP
from router.settings import Settings
from router.wiring.subscription import redis_client, store
from streams.clock import SystemClock
from streams.envelopes import decode_event
from streams.errors import EnvelopeError
from tests.chaos.matrix.scenarios import LEDGER, PROJECTOR
from tests.support.environment import ROOT, subprocess_env

Where = tuple[str, int, int]  # topic, partition, offset
WHO = "chaos-operator"
FIND_TIMEOUT_S = 90.0
CLI_TIMEOUT_S = 120.0
# A move refused because the owner moved the cursor meanwhile is asked again, this many times.
TRIES = 5
# The reprocess goes back over at least this many offsets: a re-run worth the name.
RERUN_AT_LEAST = 10


@dataclass
class Operator:
    """Runs the three moves in order, each through ``python -m router.cli``."""

    s: Settings
    done: list[str] = field(default_factory=list)  # what each move did, in one line
    problems: list[str] = field(default_factory=list)
    finished: threading.Event = field(default_factory=threading.Event)
    skipped_at: TP | None = None  # the partition whose drill event was skipped

    def start(self) -> None:
        threading.Thread(target=self._run, name="chaos-operator", daemon=True).start()

    def _run(self) -> None:
        try:
            self._skip_the_drill()
            self._reprocess_half_way()
            self._re_reduce()
        except Exception as exc:  # the row reports it
            self.problems.append(f"the operator's moves broke off: {type(exc).__name__}: {exc}")
        finally:
            self.finished.set()

    def unaudited(self) -> list[str]:
        """Each move that went through is in its subscription's audit log, once."""
        logs = {
            slug: [
                e["action"]
                for e in RedisAuditLog(redis_client(self.s), env=self.s.env, slug=slug).entries(
                    1000
                )
            ]
            for slug in (LEDGER, PROJECTOR)
        }
        want = {LEDGER: ["reprocess_from", "skip_through"], PROJECTOR: ["re_reduce"]}
        return [
            f"{slug}'s audit log holds {sorted(found)}, not {want[slug]}"
            for slug, found in logs.items()
            if sorted(found) != want[slug]
        ]

    def _cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "router.cli", *args],
            cwd=ROOT,
            env=subprocess_env(self.s),
            capture_output=True,
            text=True,
            timeout=CLI_TIMEOUT_S,
            check=False,
        )

    def _partitions(self) -> list[TP]:
        return [
            TP(topic, partition)
            for topic in self.s.topology.stream_names()
            for partition in range(self.s.partitions)
        ]

    def _skip_the_drill(self) -> None:
        """Find the partition the drill event holds (the record after its cursor is the drill),
        then skip through it."""
        ledger = store(self.s, redis_client(self.s), LEDGER, SystemClock())
        reader = KafkaReader(self.s.kafka_config())
        deadline = time.monotonic() + FIND_TIMEOUT_S
        for _ in range(TRIES):
            held: tuple[TP, int] | None = None
            while held is None and time.monotonic() < deadline:
                for tp in self._partitions():
                    at = ledger.load(tp).acked_through + 1
                    for record in reader.read(tp, at, at):
                        try:
                            event = decode_event(record.value, max_bytes=self.s.max_envelope_bytes)
                        except EnvelopeError:
                            continue
                        if event.payload.get("drill") == "fail":
                            held = (tp, at)
                if held is None:
                    time.sleep(0.5)
            if held is None:
                self.problems.append(f"no partition held by the drill event in {FIND_TIMEOUT_S}s")
                return
            tp, offset = held
            done = self._cli(
                *("subscription", "skip-through", "--subscription", LEDGER),
                *("--topic", tp.topic, "--partition", str(tp.partition), "--offset", str(offset)),
                *("--who", WHO, "--reason", "chaos: the drill event blocks its partition"),
            )
            if done.returncode == 0:
                self.done.append(f"skip-through {tp}@{offset}: {done.stdout.strip()}")
                self.skipped_at = tp
                return
            self.done.append(f"skip-through {tp}@{offset} refused: {done.stderr.strip()[-300:]}")
        self.problems.append(f"skip-through never went through: {self.done[-1]}")

    def _reprocess_half_way(self) -> None:
        """Back to half of what the fullest ledger partition (but the skipped one) applied."""
        ledger = store(self.s, redis_client(self.s), LEDGER, SystemClock())
        for _ in range(TRIES):
            found = [(ledger.load(tp), tp) for tp in self._partitions() if tp != self.skipped_at]
            progress, tp = max(found, key=lambda f: f[0].acked_through)
            if progress.acked_through < 2 * RERUN_AT_LEAST:
                time.sleep(0.5)
                continue
            offset = progress.acked_through // 2
            done = self._cli(
                *("subscription", "reprocess-from", "--subscription", LEDGER),
                *("--topic", tp.topic, "--partition", str(tp.partition), "--offset", str(offset)),
                *("--expected-revision", str(progress.cursor_revision)),
                *("--who", WHO, "--reason", "chaos: a downstream copy was lost"),
            )
            if done.returncode == 0:
                self.done.append(f"reprocess-from {tp}@{offset}: {done.stdout.strip()}")
                return
            self.done.append(f"reprocess-from {tp}@{offset} refused: {done.stderr.strip()[-300:]}")
        self.problems.append(f"reprocess-from never went through: {self.done[-1:]}")

    def _re_reduce(self) -> None:
        """A projector partition's fold rebuilt; refused when the owner moved the cursor while
        it folded (compare-and-set), and asked again."""
        projector = store(self.s, redis_client(self.s), PROJECTOR, SystemClock())
        tp = max(self._partitions(), key=lambda tp: projector.load(tp).acked_through)
        for _ in range(TRIES):
            done = self._cli(
                *("subscription", "re-reduce", "--subscription", PROJECTOR),
                *("--topic", tp.topic, "--partition", str(tp.partition)),
                *("--who", WHO, "--reason", "chaos: rebuild the fold under load"),
            )
            if done.returncode == 0:
                self.done.append(f"re-reduce {tp}: {done.stdout.strip()}")
                return
            self.done.append(f"re-reduce {tp} refused: {done.stderr.strip()[-300:]}")
        self.problems.append(f"re-reduce never went through: {self.done[-1]}")


@dataclass(frozen=True)
class Audited:
    """What the audit logs say operators did, as the events it concerns."""

    skipped: frozenset[str] = frozenset()  # events at offsets an audited skip covered
    # Events at offsets an audited reprocess_from re-ran, with the revision it re-ran them at.
    rerun: Mapping[str, int] = field(default_factory=dict)
    moves: tuple[str, ...] = ()  # each audited move, in one line


def audited(s: Settings, slug: str, where: Mapping[Where, str]) -> Audited:
    """Read ``slug``'s audit log; map its skip-through and reprocess-from moves to events by the
    offsets the streams hold (``where``: every record's place and event id)."""
    return from_entries(
        RedisAuditLog(redis_client(s), env=s.env, slug=slug).entries(1000), slug, where
    )


def from_entries(
    entries: Sequence[Mapping[str, Any]], slug: str, where: Mapping[Where, str]
) -> Audited:
    """:func:`audited` of audit entries as the log gives them, newest first."""
    skipped: set[str] = set()
    rerun: dict[str, int] = {}
    moves: list[str] = []
    for entry in reversed(entries):  # oldest first: a later reprocess re-runs what it covers
        topic, partition, action = entry["topic"], int(entry["partition"]), entry["action"]
        if action == "skip_through":
            first, last = int(entry["skipped_from"]), int(entry["offset"])
            skipped |= {
                event_id
                for (t, p, o), event_id in where.items()
                if (t, p) == (topic, partition) and first <= o <= last
            }
            moves.append(f"{slug} skip_through {topic}[{partition}] {first}..{last}")
        elif action == "reprocess_from":
            start, revision = int(entry["offset"]), int(entry["revision"])
            for (t, p, o), event_id in where.items():
                if (t, p) == (topic, partition) and o >= start:
                    rerun[event_id] = revision
            moves.append(f"{slug} reprocess_from {topic}[{partition}] {start} at {revision}")
        else:
            moves.append(f"{slug} {action} {topic}[{partition}]")
    return Audited(frozenset(skipped), rerun, tuple(moves))
