"""Operator actions on every dead letter — event batches, poison records and commands — over the
one dead-letter store: **retry** and **dismiss**, both audited on the letter (who, when, why).

- Retry of an *event* dead letter re-delivers its events to that subscription alone, through the
  subscription's redelivery topic (the partition that belongs to the events' origin partition).
- Retry of a *command* dead letter sends the original command back to its origin queue, once.
- A poison record (bytes that never decoded) cannot be retried, only dismissed.

Retry is two-phase so a double click sends once and a failed send loses nothing: the letter moves
open → retrying (check-and-set: one click wins, the other is refused), the record is sent and
acknowledged, then retrying → retried. If the send fails the letter goes back to open and the
error is raised; the operator can simply retry again. A letter left in retrying by a process that
died mid-send may be retried again once ``stale_retry_s`` passed since that retry began (the
send is then repeated: at worst the record goes out twice, which claims and command-id dedupe
absorb).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import cast

from consumers.runtime.dead_letters import DeadLetter, DeadLetterStore, LetterKind, LetterStatus
from consumers.runtime.types import TP
from streams.clock import Clock
from streams.errors import DeadLetterActionRefused
from streams.headers import OPERATOR_RETRY, ORIGIN_OFFSET, ORIGIN_PARTITION, ORIGIN_TOPIC, is_ours

# (topic, partition or None for the key's partition, key, value, headers) -> None; must not return
# before the record is durable (acks=all).
SendFn = Callable[[str, int | None, bytes | None, bytes, list[tuple[str, bytes]]], None]


@dataclass
class DeadLetterActions:
    store: DeadLetterStore
    clock: Clock
    send: SendFn
    redelivery_topic: Callable[[str], str]  # subscription slug -> its redelivery topic
    redelivery_partition: Callable[[TP], int | None]
    queue_topic: Callable[[str], str]  # queue purpose -> its topic
    stale_retry_s: float = 300.0  # a retry stuck in "retrying" this long may be taken over

    def get(self, letter_id: str) -> DeadLetter:
        letter = self.store.get(letter_id)
        if letter is None:
            raise DeadLetterActionRefused(f"no dead letter with id {letter_id!r}")
        return letter

    def retry(self, letter_id: str, *, who: str, why: str = "operator retry") -> DeadLetter:
        letter = self.get(letter_id)
        frm = LetterStatus.OPEN
        if self.is_stale_retry(letter):
            frm = LetterStatus.RETRYING  # its sender died mid-send: take the retry over
        elif letter.status != LetterStatus.OPEN:
            raise DeadLetterActionRefused(
                f"dead letter {letter_id} is {letter.status}, not open: it was already handled"
            )
        sends = self._plan(letter)
        now = self.clock.now()
        if not self.store.transition(
            letter_id, to=LetterStatus.RETRYING, who=who, why=why, now=now, frm=frm
        ):
            raise DeadLetterActionRefused(
                f"dead letter {letter_id} was already handled by someone else meanwhile"
            )
        try:
            for send in sends:
                send()
        except Exception as exc:
            self.store.transition(
                letter_id,
                to=LetterStatus.OPEN,
                who=who,
                why=f"send failed: {type(exc).__name__}: {exc}",
                now=self.clock.now(),
                frm=LetterStatus.RETRYING,
            )
            raise DeadLetterActionRefused(
                f"retry of {letter_id} could not be sent ({exc}); it is open again, retry later"
            ) from exc
        self.store.transition(
            letter_id,
            to=LetterStatus.RETRIED,
            who=who,
            why=why,
            now=self.clock.now(),
            frm=LetterStatus.RETRYING,
        )
        return self.get(letter_id)

    def is_stale_retry(self, letter: DeadLetter) -> bool:
        if letter.status != LetterStatus.RETRYING or not letter.audit:
            return False
        began = datetime.strptime(letter.audit[-1]["at"], "%Y-%m-%dT%H:%M:%S.%fZ")
        age = self.clock.now() - began.replace(tzinfo=UTC)
        return age.total_seconds() >= self.stale_retry_s

    def _plan(self, letter: DeadLetter) -> list[Callable[[], None]]:
        if letter.kind == LetterKind.POISON:
            raise DeadLetterActionRefused(
                f"dead letter {letter.id} holds bytes that are not a valid event; it can only be "
                "dismissed (fix the producer, then dismiss with a reason)"
            )
        if letter.kind == LetterKind.COMMAND:
            return self._plan_command(letter)
        return self._plan_events(letter)

    def _plan_events(self, letter: DeadLetter) -> list[Callable[[], None]]:
        if letter.subscription is None:
            raise DeadLetterActionRefused(f"dead letter {letter.id} names no subscription")
        origin = TP(letter.source_topic, letter.source_partition)
        partition = self.redelivery_partition(origin)
        if partition is None:
            raise DeadLetterActionRefused(
                f"{origin} is not one of the environment's streams; cannot redeliver"
            )
        topic = self.redelivery_topic(letter.subscription)
        plan: list[Callable[[], None]] = []
        for entry in letter.entries:
            if entry.value is None:
                continue
            headers = _clean(entry.headers) + [
                (ORIGIN_TOPIC, origin.topic.encode()),
                (ORIGIN_PARTITION, str(origin.partition).encode()),
                (ORIGIN_OFFSET, str(entry.offset).encode()),
                (OPERATOR_RETRY, letter.id.encode()),
            ]
            plan.append(self._sender(topic, partition, entry.key, entry.value, headers))
        return plan

    def _sender(
        self,
        topic: str,
        partition: int | None,
        key: bytes | None,
        value: bytes,
        headers: list[tuple[str, bytes]],
    ) -> Callable[[], None]:
        return lambda: self.send(topic, partition, key, value, headers)

    def _plan_command(self, letter: DeadLetter) -> list[Callable[[], None]]:
        entry = letter.entries[0] if letter.entries else None
        if letter.origin_queue is None or entry is None or entry.value is None:
            raise DeadLetterActionRefused(
                f"dead letter {letter.id} lacks its origin queue or the command bytes"
            )
        topic = self.queue_topic(letter.origin_queue)
        headers = _clean(entry.headers) + [(OPERATOR_RETRY, letter.id.encode())]
        return [self._sender(topic, None, entry.key, entry.value, headers)]

    def dismiss(self, letter_id: str, *, who: str, why: str) -> DeadLetter:
        if not why.strip():
            raise DeadLetterActionRefused("dismiss needs a reason")
        letter = self.get(letter_id)
        if not self.store.transition(
            letter_id, to=LetterStatus.DISMISSED, who=who, why=why, now=self.clock.now()
        ):
            raise DeadLetterActionRefused(f"dead letter {letter_id} is {letter.status}, not open")
        return self.get(letter_id)


def _clean(headers: list[tuple[str, bytes | None]]) -> list[tuple[str, bytes]]:
    """The entry's headers less those of ours (its retries, errors, origin, dead letter, under new
    names or legacy ones): a retried record starts again at attempt 1, from its origin."""
    # A header that came with no value goes back with none: the producer sends it as it is.
    return cast(list[tuple[str, bytes]], [h for h in headers if not is_ours(h[0])])
