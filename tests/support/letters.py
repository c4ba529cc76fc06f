"""Dead letters of several subscriptions and kinds, written through the real dead-letter store
(as the runtime and the dead-letter consumer write them), for the bulk actions' tests."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import orjson

from consumers.redis_conn import connect
from consumers.runtime.dead_letters import DeadLetter, Entry, LetterKind, batch_letter_id
from router.settings import Settings
from router.wiring.subscription import dead_letters
from streams.envelopes import format_time
from tests.support.operator import write_command_letter


@dataclass
class Mixed:
    """The letters' ids by what they are."""

    ledger_old: str  # an event batch of the ledger, three hours old
    ledger_new: str  # an event batch of the ledger, an hour old
    projector: str  # an event batch of project-view-projector
    poison: str  # bytes the ledger could not decode
    integration: str  # a command from the integration queue
    indexing: str  # a command from the indexing queue

    def all(self) -> list[str]:
        return [
            self.ledger_old,
            self.ledger_new,
            self.projector,
            self.poison,
            self.integration,
            self.indexing,
        ]


def event_letter(
    s: Settings, sub: str, offset: int, *, age: timedelta, kind: LetterKind = LetterKind.EVENT_BATCH
) -> DeadLetter:
    stream = s.topology.stream_names()[0]
    event_id = f"evt_{offset:032x}"
    body = {"eventId": event_id, "eventType": "task.completed", "drill": "fail"}
    poison = kind == LetterKind.POISON
    return DeadLetter(
        id=batch_letter_id(sub, stream, 0, offset, kind.value),
        kind=kind,
        source_topic=stream,
        source_partition=0,
        error="not JSON" if poison else f"drill: event {offset} is marked to fail",
        error_type="EnvelopeError" if poison else "DrillFailure",
        attempts=1 if poison else 5,
        created_at=format_time(datetime.now(UTC) - age),
        entries=[
            Entry(
                offset=offset,
                value=b"\x00not json" if poison else orjson.dumps(body),
                key=b"proj-1",
                event_id=None if poison else event_id,
            )
        ],
        subscription=sub,
    )


def write_mixed(s: Settings) -> Mixed:
    client = connect(s.redis_url, timeout=5)
    letters = [
        event_letter(s, "ledger", 1, age=timedelta(hours=3)),
        event_letter(s, "ledger", 2, age=timedelta(hours=1)),
        event_letter(s, "project-view-projector", 3, age=timedelta(minutes=50)),
        event_letter(s, "ledger", 4, age=timedelta(minutes=40), kind=LetterKind.POISON),
    ]
    dead_letters(s, client).write(letters)
    integration, _ = write_command_letter(s, client, task="task-int", queue="integration")
    indexing, _ = write_command_letter(s, client, task="task-idx", queue="indexing")
    client.close()
    ledger_old, ledger_new, projector, poison = (d.id for d in letters)
    return Mixed(ledger_old, ledger_new, projector, poison, integration.id, indexing.id)
