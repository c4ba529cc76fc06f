"""One contract each for the worker handlers' small registries (router/workers/helpers.py): the
projects' index states (``IndexStates``) and the workflow-instance registry
(``WorkflowRegistry``). Subclasses provide the factories; the in-memory twins run them in unit
tests, the Redis registries against real Redis. Two objects a subclass makes within one test
stand for two worker processes of one environment: what one records, the other sees."""

from __future__ import annotations

from dataclasses import replace
from functools import partial

from router.workers.helpers import (
    RUNNING,
    STARTING,
    IndexStates,
    WorkflowInstance,
    WorkflowRegistry,
)
from tests.support.threads import all_at_once

AT = "2026-01-01T00:00:00.000Z"


def instance(
    command_id: str, instance_id: str = "rel_p_3", kind: str = "release"
) -> WorkflowInstance:
    return WorkflowInstance(kind, instance_id, command_id, STARTING, AT)


class IndexStatesContract:
    def make_states(self) -> IndexStates:
        raise NotImplementedError

    def test_a_project_never_recorded_has_an_empty_state(self) -> None:
        assert self.make_states().get("p-unknown") == {}

    def test_the_fields_come_back_as_recorded(self) -> None:
        states = self.make_states()
        fields = {
            "status": "failed",
            "error": "BuildFailed: ünïcode ✓ in 'src/a:b'",
            "command_id": "cmd_1",
            "attempts": "3",
            "at": AT,
            "empty": "",
        }
        states.record("p1", fields)
        assert states.get("p1") == fields

    def test_a_record_replaces_the_whole_state(self) -> None:
        # A success after a failure must not keep the failure's error beside the new status.
        states = self.make_states()
        states.record("p1", {"status": "failed", "error": "disk full", "command_id": "cmd_1"})
        states.record("p1", {"status": "ok", "command_id": "cmd_2"})
        assert states.get("p1") == {"status": "ok", "command_id": "cmd_2"}

    def test_projects_are_kept_apart(self) -> None:
        states = self.make_states()
        states.record("p1", {"status": "ok"})
        states.record("p10", {"status": "failed"})
        states.record("p:1", {"status": "expired"})
        assert states.get("p1") == {"status": "ok"}
        assert states.get("p10") == {"status": "failed"}
        assert states.get("p:1") == {"status": "expired"}

    def test_the_state_is_a_copy_on_the_way_in_and_out(self) -> None:
        states = self.make_states()
        fields = {"status": "ok"}
        states.record("p1", fields)
        fields["status"] = "changed by the caller afterwards"
        got = states.get("p1")
        got["status"] = "changed by a reader"
        assert states.get("p1") == {"status": "ok"}

    def test_another_worker_reads_what_one_recorded(self) -> None:
        first, second = self.make_states(), self.make_states()
        first.record("p1", {"status": "failed"})
        second.record("p1", {"status": "ok"})
        assert first.get("p1") == {"status": "ok"}


class WorkflowRegistryContract:
    def make_registry(self) -> WorkflowRegistry:
        raise NotImplementedError

    def test_an_instance_never_started_is_none(self) -> None:
        registry = self.make_registry()
        assert registry.get("release", "rel_p_4") is None

    def test_start_registers_the_instance_as_given(self) -> None:
        registry = self.make_registry()
        mine = instance("cmd_rel_3")
        assert registry.start(mine) == mine
        assert registry.get("release", "rel_p_3") == mine

    def test_the_first_start_wins_and_later_ones_find_it(self) -> None:
        registry = self.make_registry()
        first = instance("cmd_rel_3")
        later = replace(instance("cmd_other"), started_at="2026-01-01T00:01:00.000Z")
        registry.start(first)
        assert registry.start(later) == first
        assert registry.start(first) == first  # a redelivery of the first command
        assert registry.get("release", "rel_p_3") == first

    def test_instances_are_kept_per_kind_and_id(self) -> None:
        registry = self.make_registry()
        release = instance("cmd_a", instance_id="x_1", kind="release")
        verification = instance("cmd_b", instance_id="x_1", kind="verification")
        other = instance("cmd_c", instance_id="x_10", kind="release")
        for one in (release, verification, other):
            assert registry.start(one) == one
        assert registry.get("release", "x_1") == release
        assert registry.get("verification", "x_1") == verification
        assert registry.get("release", "x_10") == other

    def test_mark_running_changes_the_status_only(self) -> None:
        registry = self.make_registry()
        first = instance("cmd_rel_3")
        registry.start(first)
        registry.mark_running("release", "rel_p_3")
        running = replace(first, status=RUNNING)
        assert registry.get("release", "rel_p_3") == running
        assert registry.start(instance("cmd_other")) == running
        registry.mark_running("release", "rel_p_3")  # again: nothing more changes
        assert registry.get("release", "rel_p_3") == running

    def test_mark_running_of_an_unknown_instance_registers_nothing(self) -> None:
        # An instance may expire between a start and its mark_running; nothing is invented.
        registry = self.make_registry()
        registry.mark_running("release", "rel_gone")
        assert registry.get("release", "rel_gone") is None
        assert registry.start(instance("cmd_a", instance_id="rel_gone")).status == STARTING

    def test_concurrent_starts_of_one_instance_have_one_winner(self) -> None:
        # Two workers receive copies of one start (a redelivery racing its original).
        registries = [self.make_registry() for _ in range(2)]
        attempts = [instance(f"cmd_{n}") for n in range(8)]
        found = all_at_once(
            [partial(registries[n % 2].start, attempt) for n, attempt in enumerate(attempts)]
        )
        winner = found[0]
        assert winner in attempts
        assert found == [winner] * len(attempts)
        assert registries[1].get("release", "rel_p_3") == winner
