"""Operator actions on event dead letters: retry (redeliver to that subscription alone, through its
redelivery topic) and dismiss (close with a reason). Both are audited on the letter.

Retry sends first and records second: of two clicks both may send, but the subscription's claims
apply the event once and only one click is recorded; a send that fails records nothing, so the
operator can simply retry again. Commands extend this in the router (back to their origin queue).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from consumers.runtime.dead_letters import DeadLetter, DeadLetterStore, Status
from consumers.runtime.types import TP
from streams.clock import Clock
from streams.errors import RhumbatronError

# (topic, partition, key, value, headers) -> None; must not return before the record is durable.
SendFn = Callable[[str, int, bytes | None, bytes, list[tuple[str, bytes]]], None]


class DeadLetterActionRefused(RhumbatronError):
    pass


@dataclass
class EventDeadLetterActions:
    store: DeadLetterStore
    clock: Clock
    send: SendFn
    redelivery_topic: Callable[[str], str]  # subscription slug -> its redelivery topic
    redelivery_partition: Callable[[TP], int | None]

    def get(self, letter_id: str) -> DeadLetter:
        letter = self.store.get(letter_id)
        if letter is None:
            raise DeadLetterActionRefused(f"no dead letter with id {letter_id!r}")
        return letter

    def retry(self, letter_id: str, *, who: str, why: str = "operator retry") -> DeadLetter:
        letter = self.get(letter_id)
        if letter.status != Status.OPEN:
            raise DeadLetterActionRefused(
                f"dead letter {letter_id} is {letter.status}, not open: it was already handled"
            )
        if letter.kind == "command" or letter.subscription is None:
            raise DeadLetterActionRefused(
                f"dead letter {letter_id} is a {letter.kind}; event retries need a subscription"
            )
        origin = TP(letter.source_topic, letter.source_partition)
        partition = self.redelivery_partition(origin)
        if partition is None:
            raise DeadLetterActionRefused(
                f"{origin} is not one of the environment's streams; cannot redeliver"
            )
        topic = self.redelivery_topic(letter.subscription)
        for entry in letter.entries:
            if entry.value is None:
                continue
            headers = [h for h in entry.headers if not h[0].startswith("rh.origin_")] + [
                ("rh.origin_topic", origin.topic.encode()),
                ("rh.origin_partition", str(origin.partition).encode()),
                ("rh.origin_offset", str(entry.offset).encode()),
                ("rh.dead_letter", letter.id.encode()),
            ]
            self.send(topic, partition, entry.key, entry.value, headers)
        if not self.store.transition(
            letter_id, to=Status.RETRIED, who=who, why=why, now=self.clock.now()
        ):
            raise DeadLetterActionRefused(
                f"dead letter {letter_id} was handled by someone else meanwhile"
            )
        return self.get(letter_id)

    def dismiss(self, letter_id: str, *, who: str, why: str) -> DeadLetter:
        if not why.strip():
            raise DeadLetterActionRefused("dismiss needs a reason")
        letter = self.get(letter_id)
        if not self.store.transition(
            letter_id, to=Status.DISMISSED, who=who, why=why, now=self.clock.now()
        ):
            raise DeadLetterActionRefused(f"dead letter {letter_id} is {letter.status}, not open")
        return self.get(letter_id)
