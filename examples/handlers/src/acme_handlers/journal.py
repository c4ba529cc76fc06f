"""Where the example handlers record what they did: one JSON line per command to the file
``$ACME_JOURNAL`` (the stand-in for the team's own service), nothing when it is unset."""

from __future__ import annotations

import json
import os
import threading

_lock = threading.Lock()


def record(**fields: object) -> None:
    path = os.environ.get("ACME_JOURNAL")
    if not path:
        return
    line = json.dumps(fields, sort_keys=True)
    with _lock, open(path, "a", encoding="utf-8") as out:
        out.write(line + "\n")
