"""The alerting service ``acme-notify`` calls, as a stand-in: each alert it sends is one JSON line
of the file ``$ACME_ALERTS_JOURNAL``, and like any API that takes an idempotency key, it sends
nothing for a key it has already seen (a worker's re-run of a command)."""

from __future__ import annotations

import fcntl
import json
import os
from dataclasses import dataclass
from pathlib import Path

JOURNAL_VARIABLE = "ACME_ALERTS_JOURNAL"


class ServiceUnavailable(Exception):
    """The service cannot be reached now; a later try may succeed."""


@dataclass(frozen=True)
class AlertService:
    journal: Path

    @classmethod
    def from_environment(cls) -> AlertService:
        path = os.environ.get(JOURNAL_VARIABLE)
        if not path:
            raise ServiceUnavailable(
                f"no alerting service configured: set {JOURNAL_VARIABLE} to the journal file"
            )
        return cls(Path(path))

    def send(self, *, idempotency_key: str, **fields: object) -> bool:
        """Send one alert; False, sending nothing, when ``idempotency_key`` was sent before."""
        line = json.dumps({"key": idempotency_key, **fields}, sort_keys=True)
        try:
            with self.journal.open("a+", encoding="utf-8") as journal:
                # Workers of several processes may call at once: one at a time reads and appends.
                fcntl.flock(journal, fcntl.LOCK_EX)
                journal.seek(0)
                if any(json.loads(sent)["key"] == idempotency_key for sent in journal):
                    return False
                journal.write(line + "\n")
                return True
        except OSError as exc:
            raise ServiceUnavailable(f"journal {self.journal}: {exc}") from exc
