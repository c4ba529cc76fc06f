"""The state layout: which shape of keys a release keeps a subscription's state in, and the
marker that stops an older release from writing beside a newer layout.

Layouts:

1. Claims by event id, in time buckets (``redis_store``), for every event.
2. Claims of outbox events by slot, per (outbox, project, cursor revision)
   (``slot_claims``); claims by id only for the other events (the pump's, a direct producer's).

Each partition's keys carry their layout in ``…:layout`` under the partition's own hash tag, so
every write script (acquire, commit, fold swap, pending clear) reads it atomically, on Redis
Cluster too; no marker means layout 1. A script that finds a layout newer than :data:`LAYOUT`
writes nothing and answers ``LAYOUT``; the store raises ``streams.errors.LayoutNewer``, and the
process stops, naming both (exit code 78, which the fleet does not restart).

A move between layouts is expand, then contract (docs/operations.md, "Upgrades"): a release
that reads both and writes the old one; then one that writes both; then ``rhumbatron state
migrate --finalize`` sets every marker (and the environment's, ``rh:<env>:{layout}``, which a
partition without keys yet takes) to the new layout, after which only the new one is written
and the releases that do not speak it refuse to run.
"""

from __future__ import annotations

from typing import Any

LAYOUT = 2  # the newest layout this release reads and writes
WRITES_SLOT_CLAIMS = (
    True  # whether it writes layout 2's slot claims (beside layout 1's, until finalized)
)


def environment_key(env: str) -> str:
    """Where ``state migrate --finalize`` records the layout a new partition starts in."""
    return f"rh:{env}:{{layout}}"


def finalize(client: Any, env: str, layout: int = LAYOUT) -> int:
    """Move every partition of every subscription of ``env`` (and the environment, for the
    partitions that have no keys yet) to ``layout``: from then on only it is written, and a
    release that does not speak it refuses to write. Returns how many partitions moved.
    Idempotent; never moves a marker back."""
    client.set(environment_key(env), layout)
    moved = 0
    for key in client.scan_iter(match=f"rh:{env}:{{*}}:epoch", count=1_000):
        marker = key[: -len(b"epoch")] + b"layout"
        found = int(client.get(marker) or 1)
        if found < layout:
            client.set(marker, layout)
            moved += 1
    return moved


def layouts(client: Any, env: str) -> dict[int, int]:
    """How many partitions of ``env`` are in each layout (for ``state migrate``'s report)."""
    counts: dict[int, int] = {}
    for key in client.scan_iter(match=f"rh:{env}:{{*}}:epoch", count=1_000):
        found = int(client.get(key[: -len(b"epoch")] + b"layout") or 1)
        counts[found] = counts.get(found, 0) + 1
    return counts
