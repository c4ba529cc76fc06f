"""The outbox's command line without Kafka: produce --outbox (concurrent writers), outbox stats
--json, retry, skip (audited) and purge, and their error messages."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import orjson
import pytest

from router.cli.main import main
from streams.outbox.store import RowState, RowUpdate
from tests.support.outbox import sqlite_outbox


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_produce_through_the_outbox(tmp_path: Path, capsys) -> None:
    path = tmp_path / "o.db"
    code, out, _ = _run(
        capsys, "produce", "--outbox", str(path), "--projects", "7", "--events", "300",
        "--run", "r1", "--json",
    )  # fmt: skip
    assert code == 0
    result = orjson.loads(out)
    assert (result["events"], result["writers"], result["duplicates"]) == (300, 4, 0)
    assert result["writes"] < 300  # several events per transaction
    conn = sqlite3.connect(path)
    slots: dict[str, list[int]] = {}
    for project, slot, envelope in conn.execute(
        "SELECT project_id, slot, envelope FROM outbox ORDER BY project_id, slot"
    ):
        slots.setdefault(project, []).append(slot)
        assert orjson.loads(envelope)["slot"] == slot
    assert len(slots) == 7
    assert all(s == list(range(1, len(s) + 1)) for s in slots.values())
    # Each write also changed the writer's own state, in the same transaction.
    writes = conn.execute("SELECT SUM(writes) FROM synthetic_writer_state").fetchone()[0]
    assert writes == result["writes"]
    conn.close()
    # The same run again: every event id exists, so all are duplicates and no slot is used.
    code, out, _ = _run(
        capsys, "produce", "--outbox", str(path), "--projects", "7", "--events", "300",
        "--run", "r1", "--json",
    )  # fmt: skip
    assert orjson.loads(out)["duplicates"] == 300
    assert sqlite_outbox(path).counts()[RowState.PENDING] == 300


def test_stats_retry_skip_and_purge(tmp_path: Path, capsys) -> None:
    path = tmp_path / "o.db"
    _run(capsys, "produce", "--outbox", str(path), "--projects", "2", "--events", "6")
    store = sqlite_outbox(path)
    heads = [r for r in store.sendable(3, 100, None) if r.slot == 1]
    store.apply(
        [
            RowUpdate(r.event_id, RowState.FAILED, 10, 0, None, "POLICY_VIOLATION", None)
            for r in heads
        ]
    )
    code, out, _ = _run(capsys, "outbox", "stats", "--outbox", str(path), "--json")
    shown = orjson.loads(out)
    assert code == 0
    assert (shown["pending"], shown["failed"], shown["published"], shown["retry_wait"]) == (
        4,
        2,
        0,
        0,
    )
    assert {h["project_id"] for h in shown["held_projects"]} == {r.project_id for r in heads}
    assert [f["last_error"] for f in shown["failed_rows"]] == ["POLICY_VIOLATION"] * 2

    code, out, _ = _run(
        capsys, "outbox", "retry", heads[0].event_id, "--outbox", str(path), "--who", "ann"
    )
    assert code == 0 and "now pending with its attempts reset" in out
    code, out, _ = _run(
        capsys, "outbox", "skip", heads[1].event_id, "--reason", "bad payload",
        "--outbox", str(path), "--who", "ben",
    )  # fmt: skip
    assert code == 0 and "moves on to slot 2" in out
    audit = store.audit_log(None, 10)
    assert [(a.who, a.action, a.reason) for a in audit] == [
        ("ann", "retry", None),
        ("ben", "skip", "bad payload"),
    ]
    code, _, err = _run(
        capsys, "outbox", "skip", heads[1].event_id, "--reason", "x", "--outbox", str(path)
    )
    assert code == 2 and "it is skipped; only a failed or retry_wait row" in err

    code, out, _ = _run(
        capsys, "outbox", "purge", "--published-before", "7d", "--outbox", str(path)
    )
    assert code == 0 and "purged 0 row(s)" in out
    code, _, err = _run(
        capsys, "outbox", "purge", "--published-before", "a week", "--outbox", str(path)
    )
    assert (
        code == 2
        and "--published-before must be a positive duration" in err
        and "got 'a week'" in err
    )
    code, _, err = _run(capsys, "outbox", "stats", "--outbox", str(tmp_path / "nope.db"))
    assert code == 2 and "no outbox at" in err
    store.close()
