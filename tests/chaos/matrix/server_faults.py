"""The server and network faults (issue 17's rows 14, 15, 17, 18 and 19): which servers such a
row gets, how its pipeline reaches them, and how each fault is injected, healed and shown to
have struck.

- ``Unreachable``: the proxy in front of the private broker or Redis cuts the pipeline off; the
  matrix's own checks go round it, straight to the server, and see that nothing got through.
- ``LeaderKill``: the 3-broker cluster loses the leader of its busiest stream partition.
- ``DataLoss``: the private Redis comes back empty.
- ``ClockJumps``: the members' wall clocks (streams/clock.py's test-only skew file) start just
  past a UTC midnight and are stepped back and forth across it, the first step back taken
  between a pass the publisher sent and its copies (the publisher frozen after Kafka's
  acknowledgement, then killed: its restart sends the pass again).
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from consumers.runtime.redis_store import DAY_MS
from consumers.runtime.types import TP
from router.settings import Settings
from router.wiring.subscription import dead_letters, redis_client, store
from streams.admin import admin_client
from streams.clock import SKEW_ENV, SystemClock
from streams.failpoints import ENV as FAILPOINTS
from streams.topology import dead_letter_topic
from tests.chaos.matrix.faults import Injector, stopped
from tests.chaos.matrix.pipeline import Pipeline
from tests.chaos.matrix.scenarios import (
    LEDGER,
    PUBLISHER,
    AtPass,
    ClockJumps,
    DataLoss,
    LeaderKill,
    Restore,
    Scenario,
    Services,
    Unreachable,
)
from tests.support.infra import PrivateServices
from tests.support.kafka import read_all
from tests.support.tcp_proxy import TcpProxy

# After a cut, what was already on its way (a script Redis had read, a produce request the broker
# had received) has landed: from then on nothing may get through.
SETTLE_S = 2.0
ELECTION_TIMEOUT_S = 90.0  # a new leader for the killed one's partition, or the row fails
SKEW_FILE = "clock-skew"
# The line `rhumbatron publish` ends with (router/cli/outbox_commands.py).
SUMMARY = re.compile(r"published \d+ rows in .*?; (\d+) retries, (\d+) rows failed")


# -- servers and settings ---------------------------------------------------------------------------
def private_services(services: Services) -> PrivateServices | None:
    """The private servers of a row of this module's kinds (None: not one of them)."""
    if services is Services.PRIVATE_CLUSTER:
        return PrivateServices(redis=False, cluster=True)
    if services is Services.PROXIED_KAFKA:
        return PrivateServices(redis=False, kafka_proxy=True)
    if services is Services.PROXIED_REDIS:
        return PrivateServices(kafka=False, redis_proxy=True)
    return None


def settings_overrides(svc: PrivateServices | None, services: Services) -> dict[str, object]:
    """The row's settings as the matrix's own checks use them: straight to the servers."""
    if svc is None:
        return {}
    if services is Services.PRIVATE_CLUSTER:
        return {"kafka_bootstrap": svc.cluster_bootstrap, "replication_factor": 3}
    if services is Services.PROXIED_KAFKA:
        return {"kafka_bootstrap": svc.bootstrap}
    if services is Services.PROXIED_REDIS:
        return {"redis_url": svc.redis_url}
    return {}


def for_pipeline(s: Settings, svc: PrivateServices | None, services: Services) -> Settings:
    """The members' settings: through the proxy, where the row has one."""
    if svc is not None and services is Services.PROXIED_KAFKA:
        return s.model_copy(update={"kafka_bootstrap": svc.proxied_bootstrap})
    if svc is not None and services is Services.PROXIED_REDIS:
        return s.model_copy(update={"redis_url": svc.proxied_redis_url})
    return s


def _jumps(scenario: Scenario) -> ClockJumps | None:
    return next((f for f, _ in scenario.strikes() if isinstance(f, ClockJumps)), None)


def _write_skew(path: Path, seconds: float) -> None:
    # Renamed into place: a member never reads a half-written number.
    tmp = path.with_suffix(".tmp")
    tmp.write_text(f"{seconds:.3f}\n")
    os.replace(tmp, path)


def member_env(scenario: Scenario, logs: Path) -> dict[str, str]:
    """Environment for every start of every member (and the final runs): the skew file of a
    clock row, its clocks set ``start_s`` past the next UTC midnight."""
    jumps = _jumps(scenario)
    if jumps is None:
        return {}
    now = datetime.now(UTC)
    midnight = datetime.combine(now.date() + timedelta(days=1), datetime.min.time(), UTC)
    path = logs / SKEW_FILE
    _write_skew(path, (midnight - now).total_seconds() + jumps.start_s)
    return {SKEW_ENV: str(path)}


def armed(scenario: Scenario) -> dict[str, dict[str, str]]:
    """A clock row freezes the publisher after Kafka acknowledged its nth pass (see ClockJumps)."""
    fault, when = scenario.fault, scenario.when
    if isinstance(fault, ClockJumps):
        assert isinstance(when, AtPass), f"{scenario.name}: the clock steps AtPass of the publisher"
        return {PUBLISHER: {FAILPOINTS: f"publisher.after_ack@{when.nth}:stop"}}
    return {}


def records(s: Settings, topics: list[str]) -> int:
    """Records on ``topics`` (every partition), asked of the broker directly."""
    consumer = Consumer({**s.kafka_config(), "group.id": "chaos-watermarks"})
    try:
        metadata = consumer.list_topics(timeout=10).topics
        return sum(
            high - low
            for topic in topics
            for partition in metadata[topic].partitions
            for low, high in [
                consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
            ]
        )
    finally:
        consumer.close()


def stream_records(s: Settings) -> int:
    """Records on the row's streams (copies included)."""
    return records(s, s.topology.stream_names())


def letters_naming(s: Settings, event_id: str) -> int:
    """Records on the dead-letter topic (the letters' durable copies) that name ``event_id``."""
    topic = dead_letter_topic(s.env)
    found = read_all(s.kafka_bootstrap, [topic], expect=records(s, [topic]), timeout=60)
    return sum(1 for m in found if event_id.encode() in (m.value() or b""))


def poison_tries(logs: Path, poison: Sequence[str]) -> dict[str, int]:
    """How many failed tries of the poison events each member logged (by its log's name): with
    a storm, whether the tries were spread over the members that held the partition in turn."""
    out: dict[str, int] = {}
    for path in sorted(logs.glob(f"{LEDGER}*.log")):
        text = path.read_text(errors="replace")
        tries = sum(
            1
            for line in text.splitlines()
            if "failed:" in line and any(f"{p} at " in line for p in poison)
        )
        if tries:
            out[path.stem] = tries
    return out


def injector_for(
    scenario: Scenario,
    pipeline: Pipeline,
    services: PrivateServices | None,
    applied: Callable[[], int],
    expected: int,
    snapshot: Callable[[], dict[str, int]],
    total: int,
    *,
    settings: Settings,
    logs: Path,
) -> Injector | None:
    """The injector of a fault of this module's kinds (None: not one of them)."""
    args = (scenario, pipeline, services, applied, expected, snapshot, total)
    fault = scenario.fault
    if isinstance(fault, Unreachable):
        return CutInjector(*args, settings=settings)
    if isinstance(fault, LeaderKill):
        return LeaderKiller(*args, settings=settings)
    if isinstance(fault, DataLoss):
        return Wiper(*args, settings=settings)
    if isinstance(fault, Restore):
        return Restorer(*args, settings=settings, snapshot_path=logs / "redis-snapshot.rdb")
    if isinstance(fault, ClockJumps):
        return ClockJumper(*args, settings=settings, skew=logs / SKEW_FILE)
    return None


# -- the injectors ----------------------------------------------------------------------------------
class ServerInjector(Injector):
    """An injector of this module: it also asks the servers directly (``s``) and leaves figures
    for the row's report in ``notes``."""

    def __init__(
        self,
        scenario: Scenario,
        pipeline: Pipeline,
        services: PrivateServices | None,
        applied: Callable[[], int],
        expected: int,
        snapshot: Callable[[], dict[str, int]],
        total: int,
        *,
        settings: Settings,
    ) -> None:
        super().__init__(scenario, pipeline, services, applied, expected, snapshot, total)
        self.s = settings
        self.notes: dict[str, object] = {}


class CutInjector(ServerInjector):
    """``Unreachable``: the proxy cut when the row's moment comes, healed ``down_s`` later."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        fault = self.scenario.fault
        assert isinstance(fault, Unreachable)
        assert self.services is not None, f"{self.scenario.name}: a cut needs its own servers"
        proxy = self.services.kafka_proxy if fault.server == "kafka" else self.services.redis_proxy
        assert proxy is not None, f"{self.scenario.name}: no proxy in front of {fault.server}"
        self.fault = fault
        self.proxy: TcpProxy = proxy
        self.dropped = 0  # connections the cut closed
        self.through: list[int] = []  # what had got through: settled after the cut, at the heal
        self._accepted_at_heal = 0

    def _got_through(self) -> int:
        """Kafka: records on the streams; Redis: events the ledger applied. Asked directly."""
        return stream_records(self.s) if self.fault.server == "kafka" else self.applied()

    def _publisher_retries(self) -> tuple[int, int]:
        """Sends that failed and were tried again, and rows that ended failed, as each start of
        the publisher summed them up on its way out."""
        member = self.pipeline.members[PUBLISHER]
        retries = failed = 0
        for n in range(member.starts):
            for found in SUMMARY.finditer(member.log(n).read_text(errors="replace")):
                retries, failed = retries + int(found[1]), failed + int(found[2])
        return retries, failed

    def poll(self) -> None:
        now = time.monotonic()
        if self.struck_at is None:
            if self._due(self.scenario.when):
                self.at_strike = self.snapshot()
                before = self.proxy.dropped
                self.proxy.cut()
                self.dropped = self.proxy.dropped - before
                self.struck_at = time.monotonic()
            return
        if self.healed_at is not None:
            return
        if not self.through and now - self.struck_at >= SETTLE_S:
            self.through.append(self._got_through())
        if now - self.struck_at >= self.fault.down_s:
            self.through.append(self._got_through())
            self._accepted_at_heal = self.proxy.accepted
            self.proxy.heal()
            self.healed_at = time.monotonic()

    def problems(self) -> list[str]:
        found = super().problems()
        if found or self.struck_at is None:
            return found
        what = "records reached the streams" if self.fault.server == "kafka" else "effects applied"
        if not self.dropped:
            found.append("the cut closed no connection: the pipeline was not using the proxy")
        if len(self.through) == 2 and self.through[1] != self.through[0]:
            found.append(
                f"{self.through[1] - self.through[0]} {what} while {self.fault.server} was cut off"
            )
        self.notes.update(
            connections_cut=self.dropped,
            reconnected=self.proxy.accepted - self._accepted_at_heal,
            through_while_cut=self.through[1] - self.through[0] if len(self.through) == 2 else None,
        )
        if self.fault.server == "kafka":
            retries, failed = self._publisher_retries()
            self.notes.update(publisher_retries=retries, publisher_failed=failed)
            if not retries:
                found.append("no send of the publisher failed: the cut never reached it")
        if self.proxy.accepted == self._accepted_at_heal:
            found.append("nothing connected through the proxy again after the heal")
        if self.fault.server == "kafka" and not 0 <= self.at_strike.get("published", -1) < (
            self.total
        ):
            found.append(f"cut off once the publisher had nothing left: {self.at_strike}")
        return found


def _busiest(admin: AdminClient, s: Settings) -> TopicPartition:
    """The stream partition holding the most records."""
    request = {
        TopicPartition(t, p): OffsetSpec.latest()
        for t in s.topology.stream_names()
        for p in range(s.partitions)
    }
    ends = {
        tp: future.result().offset
        for tp, future in admin.list_offsets(request, request_timeout=10).items()
    }
    return max(ends, key=lambda k: ends[k])


def _leader(admin: AdminClient, tp: TopicPartition) -> int:
    """The partition's leader's node id, -1 while it has none (or the metadata does not come)."""
    try:
        topic = admin.list_topics(tp.topic, timeout=2).topics[tp.topic]
    except Exception:  # a metadata request to the dead node times out: ask again
        return -1
    return int(topic.partitions[tp.partition].leader)


class LeaderKiller(ServerInjector):
    """``LeaderKill``: the busiest stream partition's leader SIGKILLed, started ``down_s``
    later; the heal also waits for another node to lead that partition."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        assert isinstance(self.scenario.fault, LeaderKill)
        self.fault = self.scenario.fault
        self.victim = -1
        self.partition = ""
        self.elected_s: float | None = None  # from the kill to a new leader

    def poll(self) -> None:
        if self.struck_at is not None or not self._due(self.scenario.when):
            return
        assert self.services is not None, f"{self.scenario.name}: a kill needs its own cluster"
        admin = admin_client(self.s.kafka_config())
        tp = _busiest(admin, self.s)
        self.victim = _leader(admin, tp)
        self.partition = f"{tp.topic}[{tp.partition}]"
        self.at_strike = self.snapshot()
        self.services.kafka_kill(str(self.victim))
        self.struck_at = killed = time.monotonic()

        def heal() -> None:
            try:
                while time.monotonic() - killed < ELECTION_TIMEOUT_S:
                    if _leader(admin, tp) not in (-1, self.victim):
                        self.elected_s = time.monotonic() - killed
                        break
                    time.sleep(0.5)
                time.sleep(max(self.fault.down_s - (time.monotonic() - killed), 0.0))
                assert self.services is not None
                self.services.kafka_start(str(self.victim))
                self.healed_at = time.monotonic()
            except BaseException as exc:  # reported as the row's problem
                self._heal_error = exc

        self._healer = threading.Thread(target=heal, name="chaos-heal", daemon=True)
        self._healer.start()

    def problems(self) -> list[str]:
        found = super().problems()
        if found or self.struck_at is None:
            return found
        self.notes.update(
            killed_node=self.victim,
            partition=self.partition,
            new_leader_after_s=None if self.elected_s is None else round(self.elected_s, 1),
        )
        if self.victim not in (1, 2, 3):
            found.append(f"{self.partition} had no leader to kill (node {self.victim})")
        if self.elected_s is None:
            found.append(f"no new leader for {self.partition} within {ELECTION_TIMEOUT_S:.0f}s")
        if not 0 <= self.at_strike.get("published", -1) < self.total:
            found.append(
                f"the leader was killed once the publisher had nothing left: {self.at_strike}"
            )
        return found


def letters_of(s: Settings) -> int:
    """Letters in the dead-letter index (-1: Redis did not answer; asked again)."""
    try:
        return len(dead_letters(s, redis_client(s, timeout=2)).list())
    except Exception:
        return -1


def check_poison_letter(
    s: Settings,
    notes: dict[str, object],
    problems: dict[str, list[str]],
    poison: list[str],
    logs: Path,
) -> None:
    """Beyond the invariants (I3 holds the poison to ``max_batch_failures`` tries in all): the
    poison event, dead-lettered before Redis lost it or went back to a snapshot, has one letter
    on the dead-letter topic, and the index holds it (rebuilt from the audit topic, or, after a
    restore, as the topic has it)."""
    if len(poison) != 1:
        problems["fault"].append(f"the row has one poison event, not {poison}")
        return
    (event_id,) = poison
    on_topic = letters_naming(s, event_id)
    indexed = [
        letter.id
        for letter in dead_letters(s, redis_client(s, timeout=5)).list()
        if event_id in [e.event_id for e in letter.entries]
    ]
    notes.update(
        poison_tries_in_all=sum(poison_tries(logs, poison).values()),
        poison_letters_on_topic=on_topic,
        poison_letters_indexed=len(indexed),
    )
    if (on_topic, len(indexed)) != (1, 1):
        problems["fault"].append(
            f"the poison {event_id} has {on_topic} letters on the dead-letter topic and "
            f"{len(indexed)} in the index (1 and 1 due)"
        )


class Wiper(ServerInjector):
    """``DataLoss``: Redis stopped, its files deleted, started empty ``down_s`` later."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        assert isinstance(self.scenario.fault, DataLoss)
        self.fault = self.scenario.fault

    def poll(self) -> None:
        if self.struck_at is not None or not self._due(self.scenario.when):
            return
        if letters_of(self.s) < self.fault.after_letters:
            return
        assert self.services is not None, f"{self.scenario.name}: a wipe needs its own Redis"
        self.at_strike = self.snapshot()
        self.notes.update(applied_before_loss=self.at_strike.get("applied"))
        services = self.services

        def wipe() -> None:
            try:
                services.redis_wipe()
                time.sleep(self.fault.down_s)
                services.redis_start()
                self.healed_at = time.monotonic()
            except BaseException as exc:  # reported as the row's problem
                self._heal_error = exc

        self.struck_at = time.monotonic()
        self._healer = threading.Thread(target=wipe, name="chaos-wipe", daemon=True)
        self._healer.start()

    def check_after(self, problems: dict[str, list[str]], poison: list[str], logs: Path) -> None:
        check_poison_letter(self.s, self.notes, problems, poison, logs)


class Restorer(ServerInjector):
    """``Restore``: a snapshot when the row's moment comes; Redis restored from it later."""

    def __init__(self, *args: Any, snapshot_path: Path, **kw: Any) -> None:
        super().__init__(*args, **kw)
        assert isinstance(self.scenario.fault, Restore)
        self.fault = self.scenario.fault
        self.path = snapshot_path
        self._taken_at: float | None = None
        self._letters_then = 0

    def poll(self) -> None:
        assert self.services is not None, f"{self.scenario.name}: a restore needs its own Redis"
        if self._taken_at is None:
            if not self._due(self.scenario.when):
                return
            letters = letters_of(self.s)
            if letters < 0:
                return
            self.services.redis_snapshot(self.path)
            self._taken_at, self._letters_then = time.monotonic(), letters
            self.notes.update(applied_at_snapshot=self.snapshot().get("applied"))
            return
        if self.struck_at is not None or time.monotonic() - self._taken_at < self.fault.after_s:
            return
        if letters_of(self.s) < self._letters_then + self.fault.after_letters:
            return
        self.at_strike = self.snapshot()
        services = self.services

        def restore() -> None:
            try:
                services.redis_restore(self.path)
                self.healed_at = time.monotonic()
            except BaseException as exc:  # reported as the row's problem
                self._heal_error = exc

        self.struck_at = time.monotonic()
        self.notes.update(snapshot_age_s=round(self.struck_at - self._taken_at, 1))
        self._healer = threading.Thread(target=restore, name="chaos-restore", daemon=True)
        self._healer.start()

    def check_after(self, problems: dict[str, list[str]], poison: list[str], logs: Path) -> None:
        check_poison_letter(self.s, self.notes, problems, poison, logs)


class ClockJumper(ServerInjector):
    """``ClockJumps``: once the publisher froze after Kafka acknowledged its pass and the ledger
    applied every record then on the streams, the clocks take their first step (back across
    midnight) and the publisher is killed, so its restart sends the pass again under the
    stepped clock; the other steps follow ``every_s`` apart."""

    def __init__(self, *args: Any, skew: Path, **kw: Any) -> None:
        super().__init__(*args, **kw)
        assert isinstance(self.scenario.fault, ClockJumps)
        self.fault = self.scenario.fault
        self.skew_path = skew
        self.skew = float(skew.read_text())
        # The UTC day the members' clocks start in, just past its midnight.
        self.new_day = int((time.time() + self.skew) * 1000) // DAY_MS
        self.steps_taken: list[tuple[float, int, int]] = []  # (step, day before, day after)
        self._records_at_freeze = -1
        self._next_at = 0.0

    def _day(self) -> int:
        return int((time.time() + self.skew) * 1000) // DAY_MS

    def _step(self, seconds: float) -> None:
        before = self._day()
        self.skew += seconds
        _write_skew(self.skew_path, self.skew)
        self.steps_taken.append((seconds, before, self._day()))

    def poll(self) -> None:
        publisher = self.pipeline.members[PUBLISHER]
        now = time.monotonic()
        if self.struck_at is None:
            if publisher.proc is not None and not publisher.exits and stopped(publisher.proc.pid):
                self.struck_at = now
                self.at_strike = self.snapshot()
                self._records_at_freeze = stream_records(self.s)
            return
        if self.healed_at is not None:
            return
        if not self.steps_taken:
            # Every record on the streams applied: the frozen pass's claims are in the new day.
            if self.applied() >= self._records_at_freeze:
                self._step(self.fault.steps[0])
                publisher.signal(signal.SIGKILL)
                self._next_at = now + self.fault.every_s
        elif now >= self._next_at:
            if len(self.steps_taken) == len(self.fault.steps):
                self.healed_at = now
            else:
                self._step(self.fault.steps[len(self.steps_taken)])
                self._next_at = now + self.fault.every_s

    def _claim_days(self) -> set[int]:
        """The days the ledger's partitions wrote claims on, as its clock read them."""
        client = redis_client(self.s)
        ledger = store(self.s, client, LEDGER, SystemClock())
        days: set[int] = set()
        for topic in self.s.topology.stream_names():
            for partition in range(self.s.partitions):
                key = ledger.prefix(TP(topic, partition)) + "claims:days"
                days |= {int(d) for d in client.smembers(key)}
        return days

    def problems(self) -> list[str]:
        found = super().problems()
        if found or self.struck_at is None:
            return found
        if len(self.steps_taken) != len(self.fault.steps):
            found.append(
                f"the clocks took {len(self.steps_taken)} of {len(self.fault.steps)} steps"
            )
        crossings = sum(1 for _, before, after in self.steps_taken if before != after)
        if not self.steps_taken or self.steps_taken[0][1:] != (self.new_day, self.new_day - 1):
            found.append(f"the first step did not go back across midnight: {self.steps_taken}")
        days = self._claim_days()
        if not {self.new_day - 1, self.new_day} <= days:
            found.append(
                f"the ledger's claims are on days {sorted(days)}, not on both sides of midnight "
                f"({self.new_day - 1}, {self.new_day}): the members' clocks did not move"
            )
        copies = stream_records(self.s) - self.total
        if copies <= 0:
            found.append("the publisher's restart sent no copy of its frozen pass")
        self.notes.update(copies=copies, midnight_crossings=crossings, claim_days=sorted(days))
        return found
