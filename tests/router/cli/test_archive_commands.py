"""``rhumbatron archive verify | expire | count`` on a local archive (no broker needed)."""

from __future__ import annotations

import gzip
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import orjson
import pytest

from consumers.runtime.parts import Line
from consumers.runtime.types import TP, Delivery, Phase
from consumers.subscriptions.archive.format import compress
from router.cli.main import main
from router.settings import Settings
from router.wiring.archive import archiver, count_parts, object_store
from streams.envelopes import Event, build
from streams.ids import stable_event_id


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    monkeypatch.setenv("RHUMBATRON_ENV", "tcli")
    monkeypatch.setenv("RHUMBATRON_ARCHIVE_DIR", str(tmp_path))
    return Settings()


def _event(day: date, n: int) -> Event:
    return build(
        Event,
        event_id=stable_event_id("cli", "task.completed", f"{day}-{n}"),
        event_type="task.completed",
        tenant_id="tenant",
        project_id=f"project-{n % 3}",
        actor="test",
        timestamp=datetime(day.year, day.month, day.day, 1, tzinfo=UTC) + timedelta(seconds=n),
        payload={"n": n},
    )


def _write_part(s: Settings, day: date, events: int, partition: int = 1) -> str:
    """One part as the archiver writes it, through its own process/finish/store."""
    proc = archiver(s)
    tp = TP(s.topology.stream_names()[3], partition)
    lines = []
    for n in range(events):
        ev = _event(day, n)
        (data,) = proc.process(ev, None, Delivery(tp, 100 + n, Phase.LIVE, True, 0)).lines
        lines.append(Line(100 + n, int(ev.timestamp.timestamp() * 1000), data))
    key, blob = proc.finish(tp, lines)
    proc.store(key, blob)
    return key


def _today() -> date:
    return datetime.now(UTC).date()


def test_verify_reports_parts_and_events_as_json(
    env: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    _write_part(env, _today(), 5, partition=0)
    _write_part(env, _today(), 7, partition=1)
    assert main(["archive", "verify", "--day", _today().isoformat(), "--json"]) == 0
    out = orjson.loads(capsys.readouterr().out)
    assert (out["parts"], out["events"], out["bad_parts"], out["ok"]) == (2, 12, [], True)
    assert out["events_by_stream"] == {"stream-03": 12}


def test_verify_exits_non_zero_and_names_a_corrupt_part(
    env: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    good = _write_part(env, _today(), 5, partition=0)
    bad = _write_part(env, _today(), 6, partition=1)
    objects = object_store(env)
    content = gzip.decompress(objects.get(bad))
    objects.put(bad, compress(content.replace(b'"n":2', b'"n":9'), 6))
    assert main(["archive", "verify", "--day", _today().isoformat(), "--json"]) == 1
    out = orjson.loads(capsys.readouterr().out)
    assert [b["key"] for b in out["bad_parts"]] == [bad]
    assert (out["parts"], out["events"]) == (1, 5)
    assert main(["archive", "verify", "--day", _today().isoformat()]) == 1
    text = capsys.readouterr().out
    assert f"BAD {bad}" in text and good not in text


def test_verify_of_a_day_with_no_parts_fails_and_says_where_it_looked(
    env: Settings, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _write_part(env, _today() - timedelta(days=1), 3)  # another day's part is not this day's
    day = _today().isoformat()
    assert main(["archive", "verify", "--day", day]) == 1
    captured = capsys.readouterr()
    assert f"archive {day}: 0 good parts" in captured.out
    (line,) = captured.err.splitlines()  # no start line: the sweep had nothing to go through
    assert line.startswith(f"rhumbatron: no archive parts for {day} in directory ")
    assert f"{(tmp_path / 'tcli').resolve()} (keys events/{day}/*)" in line
    assert "nothing was verified" in line and "'tcli'" in line
    assert main(["archive", "verify", "--day", day, "--json"]) == 1
    out = orjson.loads(capsys.readouterr().out)
    assert (out["parts"], out["ok"]) == (0, False)
    assert out["looked_in"] == f"directory {tmp_path / 'tcli'}, keys events/{day}/*"


def test_verify_prints_its_start_line_once_the_store_answers(
    env: Settings, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _write_part(env, _today(), 3)
    assert main(["archive", "verify", "--day", _today().isoformat()]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err[0] == (
        f"archive verify {_today().isoformat()} in directory {(tmp_path / 'tcli').resolve()}: "
        f"env tcli, state dir {env.state_dir}"
    )
    assert err[-1] == "verify: 1/1 parts (100%)"


def test_expire_dry_run_then_expire_with_progress(
    env: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    old = _today() - timedelta(days=40)
    _write_part(env, old, 3)
    _write_part(env, old, 4, partition=0)
    _write_part(env, _today() - timedelta(days=30), 3)
    _write_part(env, _today(), 3)
    assert main(["archive", "expire", "--dry-run"]) == 0
    captured = capsys.readouterr()
    assert "would delete 2 parts of 1 days" in captured.out
    assert "expire (dry run): 2/2 parts (100%)" in captured.err
    assert count_parts(env) == 4
    assert main(["archive", "expire", "--json"]) == 0
    captured = capsys.readouterr()
    report = orjson.loads(captured.out)
    assert (report["parts_deleted"], report["days_deleted"], report["parts_kept"]) == (
        2,
        [old.isoformat()],
        2,
    )
    assert report["retention_days"] == 30
    assert "expire: 2/2 parts (100%)" in captured.err
    assert count_parts(env, old) == 0 and count_parts(env) == 2
    assert main(["archive", "count"]) == 0
    assert capsys.readouterr().out.strip() == "2"


def test_prod_keeps_a_year(
    env: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("RHUMBATRON_ENV", "prod")
    prod = Settings()
    _write_part(prod, _today() - timedelta(days=40), 3)
    _write_part(prod, _today() - timedelta(days=400), 3)
    assert main(["archive", "expire", "--json"]) == 0
    report = orjson.loads(capsys.readouterr().out)
    assert report["retention_days"] == 365 and report["parts_deleted"] == 1
    assert count_parts(prod) == 1


def test_a_bad_day_is_refused_naming_it(env: Settings, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["archive", "verify", "--day", "2026-13-01"]) == 2
    assert "'2026-13-01' is not a date in the form YYYY-MM-DD" in capsys.readouterr().err


def test_the_s3_store_needs_a_bucket(env: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RHUMBATRON_ARCHIVE_STORE", "s3")
    assert main(["archive", "count"]) == 2
