"""`make test`'s subset of the chaos matrix (tests/chaos/matrix, all of it with `make chaos`): the
rows marked ``fast``, each the whole pipeline on real servers with its fault, checked against
I1 to I5. A row that kills a server runs on private ones, so the shared servers stay undisturbed."""

from __future__ import annotations

import pytest

from router.settings import Settings
from router.wiring.provisioning import provision_environment
from router.wiring.subscription import redis_client
from streams.workload import slotted_events, workload
from tests.chaos.matrix import invariants
from tests.chaos.matrix.runner import run_row
from tests.chaos.matrix.scenarios import LEDGER, SCENARIOS, Scenario
from tests.support.runtime_processes import consume_cli, publish, runtime_settings

pytestmark = [pytest.mark.integration, pytest.mark.chaos]


@pytest.mark.parametrize("scenario", [s for s in SCENARIOS if s.fast], ids=lambda s: s.name)
def test_row(scenario: Scenario) -> None:
    row = run_row(scenario)
    problems = [f"{name}: {p}" for name, found in row.problems.items() for p in found]
    assert row.passed, f"{row.line()}\n" + "\n".join(problems) + f"\nlogs: {row.logs}"


def test_the_checks_see_a_lost_a_doubled_and_an_out_of_order_effect(settings: Settings) -> None:
    """The invariants are not vacuous: a ledger run to its end passes them, and the same record
    with one effect removed, one counted twice and one slot applied again fails I1, I2 and I4;
    a poison event the ledger never dead-lettered fails I3."""
    s = runtime_settings(settings, batch_size=50)
    provision_environment(s)
    drafts = workload("checks", 4, 80)
    events = slotted_events(drafts, tenant_id="t")
    publish(s, events)
    done = consume_cli(s, LEDGER, until_idle=2)
    assert done.returncode == 0, done.stderr[-2000:]
    evidence = invariants.Evidence(
        drafts=drafts, poison=[], arrived=events, drains={}, drained_in_s=1.0, drain_bound_s=9
    )
    assert invariants.ledger_effects(s, evidence) == {"I1": [], "I2": [], "I4": []}
    assert invariants.letters(s, evidence) == {"I3": []}

    client = redis_client(s)
    counts = sorted(client.scan_iter(match=f"rh:{s.env}:*:x:ledger:counts"))[0]
    lost, doubled = sorted(client.hkeys(counts))[:2]
    client.hdel(counts, lost)
    client.hincrby(counts, doubled, 1)
    project = sorted(client.scan_iter(match=f"rh:{s.env}:*:x:ledger:project:*"))[0]
    client.rpush(project, 1)
    found = invariants.ledger_effects(s, evidence)
    assert lost.decode() in found["I1"][0], found
    assert doubled.decode() in found["I2"][0], found
    assert found["I4"], found
    poisoned = invariants.Evidence(
        drafts=drafts,
        poison=[drafts[0].event_id],
        arrived=events,
        drains={},
        drained_in_s=1.0,
        drain_bound_s=9,
    )
    assert invariants.letters(s, poisoned)["I3"], "a missing dead letter went unseen"
