"""One contract each for the workers' ledgers (STYLE: shared test classes per interface): the
completed-command ledger (``CommandLedger``) and the per-queue counters (``WorkerMetrics``).
Subclasses provide the factories; the in-memory twins run it in unit tests, the Redis ledgers
against real Redis. Two objects a subclass makes within one test stand for two worker processes
of one environment: what one records, the other sees."""

from __future__ import annotations

import threading
from collections.abc import Iterator

from router.workers.stores import ENDED, CommandLedger, WorkerMetrics

WAKES = "agent-wakeups"
INDEXING = "indexing"


def once(*ids: str) -> Iterator[str]:
    """The ids as a generator, as the worker passes them: it can be read only once."""
    yield from ids


class CommandLedgerContract:
    def make_ledger(self) -> CommandLedger:
        raise NotImplementedError

    @staticmethod
    def expect_done(ledger: CommandLedger, asked: list[str], want: set[str]) -> None:
        got = ledger.done_among(asked)
        assert got == want, f"done among {asked}: {got}, expected {want}"

    def test_unknown_ids_are_not_done(self) -> None:
        ledger = self.make_ledger()
        self.expect_done(ledger, ["cmd_a", "cmd_b"], set())

    def test_done_ids_are_found_among_unknown_ones_and_repeats(self) -> None:
        ledger = self.make_ledger()
        ledger.mark_done(["cmd_a", "cmd_c"])
        self.expect_done(ledger, ["cmd_b", "cmd_a", "cmd_a", "cmd_c", "cmd_d"], {"cmd_a", "cmd_c"})

    def test_marking_done_again_is_idempotent(self) -> None:
        ledger = self.make_ledger()
        ledger.mark_done(["cmd_a", "cmd_a"])
        ledger.mark_done(["cmd_a"])
        self.expect_done(ledger, ["cmd_a", "cmd_b"], {"cmd_a"})

    def test_empty_inputs_are_answered_and_change_nothing(self) -> None:
        ledger = self.make_ledger()
        ledger.mark_done([])
        ledger.mark_done(once())
        self.expect_done(ledger, [], set())
        got = ledger.done_among(once())
        assert got == set(), f"done among no ids: {got}"
        self.expect_done(ledger, ["cmd_a"], set())

    def test_follow_ups_are_kept_with_the_done_mark(self) -> None:
        ledger = self.make_ledger()
        ledger.mark_done(once("cmd_a", "cmd_b", "cmd_c"), {"cmd_a": b"\x91packed", "cmd_c": b""})
        self.expect_done(ledger, ["cmd_a", "cmd_b", "cmd_c"], {"cmd_a", "cmd_b", "cmd_c"})
        got = ledger.follow_ups_of(once("cmd_a", "cmd_b", "cmd_c", "cmd_x"))
        assert got == {"cmd_a": b"\x91packed"}, f"follow-ups kept: {got}"
        assert ledger.follow_ups_of([]) == {}

    def test_retry_chains_are_marked_started_and_ended(self) -> None:
        ledger = self.make_ledger()
        assert ledger.in_flight_among(["cmd_a"]) == {}
        ledger.track({"cmd_a": "q:0:5", "cmd_b": "q:1:7"}, {})
        got = ledger.in_flight_among(once("cmd_a", "cmd_b", "cmd_c"))
        assert got == {"cmd_a": "q:0:5", "cmd_b": "q:1:7"}, f"chains started: {got}"
        ledger.track({}, {"cmd_a": "r:0:9"})
        got = ledger.in_flight_among(["cmd_a", "cmd_b"])
        assert got == {"cmd_a": ENDED + "r:0:9", "cmd_b": "q:1:7"}, f"a chain ended: {got}"
        ledger.track({}, {})
        assert ledger.in_flight_among([]) == {}

    def test_ids_may_come_as_generators(self) -> None:
        ledger = self.make_ledger()
        ledger.mark_done(once("cmd_a", "cmd_b"))
        got = ledger.done_among(once("cmd_b", "cmd_c", "cmd_a"))
        assert got == {"cmd_a", "cmd_b"}, f"done among a generator of ids: {got}"

    def test_ids_match_exactly_whatever_characters_they_hold(self) -> None:
        ledger = self.make_ledger()
        odd = ["cmd_a:attempt:2", "cmd_{tag}*?[x]", "cmd_ü ✓", ""]
        ledger.mark_done(["cmd_a", *odd])
        self.expect_done(ledger, ["cmd_", "cmd_ab", "CMD_A", "cmd_a:attempt"], set())
        self.expect_done(ledger, ["cmd_a", *odd], {"cmd_a", *odd})

    def test_another_worker_finds_what_one_marked_done(self) -> None:
        first, second = self.make_ledger(), self.make_ledger()
        first.mark_done(["cmd_a"])
        second.mark_done(["cmd_b"])
        self.expect_done(second, ["cmd_a", "cmd_b"], {"cmd_a", "cmd_b"})
        self.expect_done(first, ["cmd_a", "cmd_b"], {"cmd_a", "cmd_b"})


class WorkerMetricsContract:
    def make_metrics(self) -> WorkerMetrics:
        raise NotImplementedError

    def read_metrics(self) -> dict[str, dict[str, int]]:
        """Every queue that counted anything: ``{queue: {counter: value}}``."""
        raise NotImplementedError

    def expect_metrics(self, want: dict[str, dict[str, int]]) -> None:
        got = self.read_metrics()
        assert got == want, f"counters read {got}, expected {want}"

    def test_nothing_counted_reads_as_no_queues(self) -> None:
        self.make_metrics()
        self.expect_metrics({})

    def test_counts_accumulate_per_queue_and_counter(self) -> None:
        metrics = self.make_metrics()
        metrics.add(WAKES, {"ok": 3, "false_wakeup": 1})
        metrics.add(WAKES, {"ok": 2, "retried": 4})
        metrics.add(INDEXING, {"ok": 1})
        self.expect_metrics(
            {INDEXING: {"ok": 1}, WAKES: {"false_wakeup": 1, "ok": 5, "retried": 4}}
        )

    def test_zero_counts_are_not_recorded(self) -> None:
        # The worker reports every batch's ``failed`` count, zero or not; a counter that never
        # counted anything is not shown, and a queue that only counted zeros is not either.
        metrics = self.make_metrics()
        metrics.add(WAKES, {"ok": 2, "failed": 0})
        metrics.add(INDEXING, {"failed": 0})
        metrics.add(INDEXING, {})
        self.expect_metrics({WAKES: {"ok": 2}})

    def test_counts_of_two_workers_add_up(self) -> None:
        first, second = self.make_metrics(), self.make_metrics()
        first.add(WAKES, {"ok": 3, "dead_lettered": 1})
        second.add(WAKES, {"ok": 2, "dead_lettered": 1})
        self.expect_metrics({WAKES: {"dead_lettered": 2, "ok": 5}})

    def test_counts_added_at_once_by_many_threads_are_all_kept(self) -> None:
        # A worker's handler threads and a second process add to one counter at the same time.
        workers = [self.make_metrics() for _ in range(2)]
        gate = threading.Barrier(8)

        def count(metrics: WorkerMetrics) -> None:
            gate.wait()
            for _ in range(50):
                metrics.add(WAKES, {"ok": 1, "retried": 2})

        threads = [threading.Thread(target=count, args=(workers[n % 2],)) for n in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.expect_metrics({WAKES: {"ok": 400, "retried": 800}})
