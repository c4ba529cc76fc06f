"""One slot sequence per project: the router's own outbox is the writers' outbox, on either
backend (``router_outbox_path`` a file or a ``postgresql://`` URL), so the events the router
decides (``candidate.stale``) take the next slots of the same per-project counter as the
writers' events, never a second sequence."""

from __future__ import annotations

from pathlib import Path

from router.wiring.causal import open_router_outbox, router_outbox_path
from router.wiring.outbox import open_outbox
from streams.envelopes import Draft, decode_event
from streams.outbox.store import RowState
from tests.support.causal_router import History, drive, make_router
from tests.support.environment import make_settings
from tests.support.outbox import OutboxBackend


def _history() -> History:
    h = History(project="proj-shared")
    h.add("verification.started", change="chg-1", candidateId="open", workGraphCompleted=True)
    h.add("verification.started", change="chg-2", candidateId="win", workGraphCompleted=True)
    h.add("artifact.promoted", change="chg-2", candidateId="win", generation=1)
    h.add("canonical.advanced", change=None, generation=1)
    return h


def test_the_routers_events_take_the_next_slots_of_the_writers_sequence(
    outbox_backend: OutboxBackend, tmp_path: Path
) -> None:
    s = make_settings(router_outbox_path=outbox_backend.address, state_dir=str(tmp_path))
    assert str(router_outbox_path(s)) == outbox_backend.address
    h = _history()
    # The service writes its events through the outbox (slots 1..4) ...
    writers = open_outbox(s, outbox_backend.address, create=True)
    try:
        with writers.transaction() as unit:
            written = unit.append(
                h.project,
                [
                    Draft(
                        event_id=e.event_id,
                        event_type=e.event_type,
                        project_id=e.project_id,
                        change_id=e.change_id,
                        task_id=e.task_id,
                        actor=e.actor,
                        payload=e.payload,
                        canonical_generation=e.canonical_generation,
                    )
                    for e in h.events
                ],
                tenant_id=h.tenant,
            )
        assert written.slots == [1, 2, 3, 4]
        # ... and the router, reading them, decides candidate.stale into its own outbox.
        router_outbox = open_router_outbox(s)
        try:
            assert router_outbox.location == writers.location
            drive(make_router(router_outbox), h.events)
        finally:
            router_outbox.close()
        assert writers.last_slot(h.project) == 5
        rows = writers.rows_in_state(RowState.PENDING, 100)  # in (project, slot) order
    finally:
        writers.close()
    assert [r.slot for r in rows] == [1, 2, 3, 4, 5]
    assert [r.event_id for r in rows[:4]] == [e.event_id for e in h.events]
    stale = decode_event(rows[4].envelope, max_bytes=s.max_envelope_bytes)
    assert (stale.event_type, stale.payload["candidateId"], stale.slot) == (
        "candidate.stale",
        "open",
        5,
    )
