"""The ledger's record of a deliberate re-run: every application in its counts and project lists
as before, and those at a cursor revision above 0 also under that revision, so a witness tells
one application per revision from a doubled one."""

from __future__ import annotations

from consumers.subscriptions.ledger import Ledger
from tests.support.runtime_harness import World, event


def test_a_reprocess_records_its_reruns_under_their_revision() -> None:
    world = World()
    for n in range(1, 5):
        world.publish(event("alpha", n))
    runner = world.runner(Ledger())
    world.drain(runner)
    tp = world.tp_of("alpha")
    world.controls(Ledger()).reprocess_from(tp, 2, expected_revision=0, who="oncall", why="x")
    world.drain(runner)
    assert world.ledger() == {"alpha": [1, 2, 3, 4, 3, 4]}
    revised: dict[str, int] = {}
    for key, value in world.store.space.data.items():
        if key.endswith("|ledger:revisions"):
            revised.update({k: int(v) for k, v in value.items()})  # type: ignore[attr-defined]
    assert revised == {f"{event('alpha', n).event_id}@1": 1 for n in (3, 4)}
