"""One contract for the operator controls' audit log (consumers/runtime/controls.py:
``AuditLog``), run on the in-memory twin and on Redis. Subclasses provide ``make_log(slug)``: one
log per subscription; two logs a subclass makes for one slug within a test stand for two
processes of one environment."""

from __future__ import annotations

from functools import partial
from typing import Any

from consumers.runtime.controls import AuditLog
from tests.support.threads import all_at_once

SLUG = "projector"


def entry(n: int, **details: Any) -> dict[str, Any]:
    return {"action": "skip_through", "topic": "s0", "partition": 0, "offset": n, **details}


class AuditLogContract:
    def make_log(self, slug: str = SLUG) -> AuditLog:
        raise NotImplementedError

    def test_a_log_with_nothing_appended_is_empty(self) -> None:
        assert self.make_log().entries() == []

    def test_entries_come_newest_first(self) -> None:
        log = self.make_log()
        for n in range(3):
            log.append(entry(n))
        assert [e["offset"] for e in log.entries()] == [2, 1, 0]

    def test_the_limit_keeps_the_newest(self) -> None:
        log = self.make_log()
        for n in range(5):
            log.append(entry(n))
        assert [e["offset"] for e in log.entries(limit=1)] == [4]
        assert [e["offset"] for e in log.entries(limit=3)] == [4, 3, 2]
        assert [e["offset"] for e in log.entries(limit=5)] == [4, 3, 2, 1, 0]
        assert [e["offset"] for e in log.entries(limit=50)] == [4, 3, 2, 1, 0]

    def test_the_default_limit_is_a_hundred_and_older_entries_are_kept(self) -> None:
        log = self.make_log()
        for n in range(101):
            log.append(entry(n))
        assert [e["offset"] for e in log.entries()] == list(range(100, 0, -1))
        assert log.entries(limit=101)[-1]["offset"] == 0

    def test_an_entry_comes_back_as_the_json_it_was(self) -> None:
        log = self.make_log()
        written = entry(
            7,
            who="ölaf ✓",
            why="",
            refused=[3, 5],
            cut={"from": 1, "through": None},
            reduced=True,
            ratio=0.5,
        )
        log.append(written)
        [read] = log.entries()
        # Each entry comes back with its own id: its key on the durable audit topic.
        assert read.pop("audit_id")
        assert read == written

    def test_the_log_keeps_its_own_copy(self) -> None:
        # An audit entry is a record: neither its writer nor a reader can change it afterwards.
        log = self.make_log()
        written = entry(1, refused=[3])
        log.append(written)
        written["who"] = "changed by the writer"
        written["refused"].append(4)
        read = log.entries()[0]
        read["offset"] = 99
        [again] = log.entries()
        again.pop("audit_id")
        assert again == entry(1, refused=[3])

    def test_each_subscription_has_its_own_log(self) -> None:
        projector, router = self.make_log("projector"), self.make_log("causal-router")
        projector.append(entry(1))
        assert router.entries() == []
        assert [e["offset"] for e in projector.entries()] == [1]

    def test_two_processes_append_to_one_log(self) -> None:
        one, two = self.make_log(), self.make_log()
        one.append(entry(1))
        two.append(entry(2))
        assert [e["offset"] for e in one.entries()] == [2, 1]

    def test_concurrent_appends_are_each_kept_once(self) -> None:
        logs = [self.make_log() for _ in range(2)]
        all_at_once([partial(logs[n % 2].append, entry(n)) for n in range(16)])
        assert sorted(e["offset"] for e in logs[0].entries()) == list(range(16))
        assert len({e["audit_id"] for e in logs[0].entries()}) == 16
