"""The runtime commands on the real broker and Redis: they never create topics (an environment
that is not provisioned is refused in one line naming what is missing, and is left as it was),
they say what they work on when they start and how far they got while they run, and their
summaries name what each number counts. Run as processes: stderr is a pipe, so the progress is
plain lines."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from router.settings import Settings
from router.wiring.outbox import open_outbox
from streams.admin import admin_client
from streams.workload import slotted_events, workload
from tests.support.environment import (
    ROOT,
    cleanup_environment,
    make_settings,
    run_cli,
    subprocess_env,
)
from tests.support.runtime_processes import publish, runtime_settings

pytestmark = pytest.mark.integration

# Progress every fifth of a second: a run of a few seconds prints several lines.
FAST_PROGRESS = {"RHUMBATRON_PROGRESS_INTERVAL_S": "0.2"}


@pytest.fixture
def s() -> Iterator[Settings]:
    settings = runtime_settings(make_settings())
    yield settings
    cleanup_environment(settings)


def _topics_of(s: Settings) -> list[str]:
    listed = admin_client(s.kafka_config()).list_topics(timeout=10).topics
    return sorted(t for t in listed if t.endswith(f"_{s.env}") or t.endswith(f"-{s.env}"))


def _cli(s: Settings, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    return run_cli(s, *args, env=subprocess_env(s, **extra))


def _one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("rhumbatron: "), result.stderr
    assert result.returncode == 2
    return lines[0]


@pytest.mark.parametrize(
    "args",
    [
        ("consume", "--subscription", "ledger", "--until-idle", "1"),
        ("consume", "--subscription", "causal-router", "--until-idle", "1"),
        ("worker", "--queue", "integration", "--handler", "ok", "--until-idle", "1"),
        ("dead-letter-consumer", "--until-idle", "1"),
        ("produce", "--projects", "1", "--events", "3"),
        ("produce", "--drill", "fail"),
    ],
    ids=lambda args: "-".join(args[:2]),
)
def test_a_runtime_command_on_an_unprovisioned_environment_is_refused_and_creates_nothing(
    s: Settings, tmp_path: Path, args: tuple[str, ...]
) -> None:
    line = _one_line_error(
        _cli(s, *args, RHUMBATRON_ROUTER_OUTBOX_PATH=str(tmp_path / "router.sqlite"))
    )
    assert f"environment '{s.env}' is not provisioned: missing " in line, line
    assert "run `rhumbatron provision`" in line
    assert _topics_of(s) == []
    if args[0] == "consume":
        # Every stream named, as one run; the subscription's own redelivery topic too.
        assert f"rhumbatron_events_00-07_{s.env}" in line
        assert f"rhumbatron_redelivery_{args[2].replace('-', '_')}_{s.env}" in line
        assert "(18 topics)" in line  # the audit topic too
        assert not (tmp_path / "router.sqlite").exists()  # refused before anything was built


def test_publish_on_an_unprovisioned_environment_is_refused_and_creates_nothing(
    s: Settings, tmp_path: Path
) -> None:
    path = tmp_path / "outbox.db"
    open_outbox(s, path, create=True).close()
    line = _one_line_error(_cli(s, "publish", "--outbox", str(path), "--until-empty"))
    assert f"missing rhumbatron_events_00-07_{s.env} (8 topics)" in line
    assert _topics_of(s) == []


def test_provision_makes_every_topic_the_runtime_needs_and_status_reports_what_is_missing(
    s: Settings,
) -> None:
    before = orjson.loads(_cli(s, "status", "--json").stdout)
    assert _topics_of(s) == []  # a read: it reports, never creates
    # 8 streams, 6 queues, 6 retry topics and 3 tiers of each, 6 internal topics (the audit
    # topic among them) and the redelivery topics of the 4 subscriptions and the ledger... as
    # the plan says.
    assert len(before["missing_topics"]) == 29 + 6 * len(s.retry_tiers_s)
    assert before["state_dir"] == str(s.state_dir)
    plain = _cli(s, "status")
    assert plain.returncode == 0
    assert f"not provisioned: missing rhumbatron_events_00-07_{s.env}" in plain.stdout
    assert f"state dir {s.state_dir}" in plain.stdout.splitlines()[0]

    assert _cli(s, "provision").returncode == 0
    assert _topics_of(s) == sorted(before["missing_topics"])
    assert orjson.loads(_cli(s, "status", "--json").stdout)["missing_topics"] == []
    # Everything a runtime command checks for is there: each starts and stops cleanly.
    for args in (
        ("consume", "--subscription", "ledger", "--until-idle", "1"),
        ("worker", "--queue", "indexing", "--handler", "ok", "--until-idle", "1"),
    ):
        done = _cli(s, *args)
        assert done.returncode == 0, done.stderr[-3000:]
    assert _topics_of(s) == sorted(before["missing_topics"])  # and created nothing more


def test_consume_says_what_it_reads_shows_progress_and_explains_its_summary(s: Settings) -> None:
    assert _cli(s, "provision").returncode == 0
    events = slotted_events(workload("progress", 4, 60), tenant_id="t")
    publish(s, events)
    done = _cli(
        s, "consume", "--subscription", "project-view-projector", "--until-idle", "3",
        **FAST_PROGRESS,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stderr.splitlines()
    slug = "project-view-projector"
    assert lines[0] == (
        f"consume {slug}: env {s.env}, group rhumbatron-{slug}-{s.env}, topics "
        f"rhumbatron_events_00-07_{s.env}, rhumbatron_redelivery_project_view_projector_{s.env} "
        f"(9), state dir {s.state_dir}"
    )
    progress = re.compile(
        rf"^consume {slug}: (\d+) records, (\d+) applied, (\d+) dead-lettered, lag (\d+|\?) "
        r"\[\d+s\]$"
    )
    shown = [m for line in lines[1:-1] if (m := progress.match(line))]
    assert shown, done.stderr
    assert all(int(m.group(2)) <= len(events) for m in shown)
    assert lines[-1] == (
        f"{slug}: {len(events)} records, {len(events)} applied, 0 duplicates, 0 dead-lettered "
        "(0 poison, 0 failed batches), 0 not for this subscription, 0 held back or already "
        "done; 0 failed batch attempts"
    ), lines[-1]


def test_a_worker_says_what_it_reads_and_explains_what_it_settled(s: Settings) -> None:
    assert _cli(s, "provision").returncode == 0
    done = _cli(
        s, "worker", "--queue", "indexing", "--handler", "ok", "--until-idle", "2", **FAST_PROGRESS
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stderr.splitlines()
    assert lines[0].startswith(
        f"worker indexing (ok): env {s.env}, group rhumbatron-worker-indexing-{s.env}, topics "
        f"rhumbatron-indexing-{s.env}, rhumbatron-indexing-retry-{s.env}, "
        f"rhumbatron-indexing-retry-60s-{s.env}, rhumbatron-indexing-retry-600s-{s.env}, "
        f"rhumbatron-indexing-retry-3600s-{s.env} (5), state dir "
    ), lines[0]
    assert any(
        re.match(r"^worker indexing \(ok\): 0 records, .*, lag \d+ \[\d+s\]$", x) for x in lines
    )
    assert lines[-1] == (
        "worker indexing (ok): 0 records settled: none (0 attempts failed in the handler); "
        "0 transactions (0 failed)"
    )
    assert orjson.loads(done.stdout)["records"] == 0  # stdout keeps the figures as JSON


@pytest.mark.slow  # 27 s; the unit tests hold each part of it to the settings
def test_a_queue_of_your_own_is_provisioned_served_and_dead_lettered_with_no_code_change(
    s: Settings,
) -> None:
    own = {"RHUMBATRON_QUEUES__PAYMENTS__RETRIES": "0"}
    worker = ("worker", "--queue", "payments", "--handler", "drill", "--until-idle", "2")
    refused = _one_line_error(_cli(s, *worker))  # settings without it
    assert "--queue: unknown queue 'payments'; known: agent-wakeups, " in refused
    before = set(_topics_of(s))
    assert _cli(s, "provision", **own).returncode == 0
    mine = [
        f"rhumbatron-payments-{s.env}",
        f"rhumbatron-payments-retry-{s.env}",
        *(f"rhumbatron-payments-retry-{t}s-{s.env}" for t in s.retry_tiers_s),
    ]
    assert set(mine) <= set(_topics_of(s)) - before
    for payload in ('{"drill": "ok"}', '{"drill": "fail"}'):
        sent = _cli(
            s, "command", "send", "--type", "index.build", "--project", "p1",
            "--queue", "payments", "--payload", payload, "--json", **own,
        )  # fmt: skip
        assert sent.returncode == 0, sent.stderr
        assert orjson.loads(sent.stdout)["topic"] == mine[0]
    done = _cli(s, *worker, **own)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr.splitlines()[0].startswith(
        f"worker payments (drill): env {s.env}, group rhumbatron-worker-payments-{s.env}, "
        f"topics {', '.join(mine)} (5), "
    )
    settled = orjson.loads(done.stdout)
    assert (settled["records"], settled["ok"], settled["dead_lettered"]) == (2, 1, 1)
    recorded = _cli(s, "dead-letter-consumer", "--until-idle", "2", **own)
    assert recorded.returncode == 0, recorded.stderr[-3000:]
    listed = _cli(s, "dead-letters", "list", "--queue", "payments", "--json", **own)
    assert [d["origin_queue"] for d in orjson.loads(listed.stdout)] == ["payments"]


def test_drill_records_end_as_the_dead_letters_the_docs_describe(s: Settings) -> None:
    s = runtime_settings(s, batch_retry_backoff_s=0.05, batch_retry_backoff_max_s=0.1)
    assert _cli(s, "provision").returncode == 0
    fail = orjson.loads(_cli(s, "produce", "--drill", "fail", "--json").stdout)
    garbage = orjson.loads(_cli(s, "produce", "--drill", "garbage", "--json").stdout)
    done = _cli(s, "consume", "--subscription", "ledger", "--until-idle", "3")
    assert done.returncode == 0, done.stderr[-3000:]
    summary = done.stderr.splitlines()[-1]
    assert "2 dead-lettered (1 poison, 1 failed batches)" in summary, summary
    assert f"; {s.max_batch_failures} failed batch attempts" in summary, summary

    letters = orjson.loads(_cli(s, "dead-letters", "list", "--json").stdout)
    by_kind = {letter["kind"]: letter for letter in letters}
    batch, poison = by_kind["event-batch"], by_kind["poison"]
    assert batch["events"] == [fail["event_id"]]
    assert batch["source"] == f"{fail['topic']}[{fail['partition']}]"
    assert batch["attempts"] == s.max_batch_failures
    assert "LedgerDrillFailure" in batch["error"] and "marked to fail" in batch["error"]
    assert poison["source"] == f"{garbage['topic']}[{garbage['partition']}]"
    assert poison["offsets"] == [garbage["offset"]]
    assert poison["attempts"] == 1 and "EnvelopeError" in poison["error_type"]


def test_projects_list_and_a_feed_read_into_a_closed_pipe(s: Settings) -> None:
    empty = _cli(s, "projects", "list")
    assert (empty.returncode, empty.stdout) == (
        0,
        f"no projects: project-view-projector has built no view in '{s.env}' (run rhumbatron "
        "consume --subscription project-view-projector)\n",
    )
    assert orjson.loads(_cli(s, "projects", "list", "--json").stdout) == []

    assert _cli(s, "provision").returncode == 0
    events = slotted_events(workload("list", 3, 45), tenant_id="t")
    publish(s, events)
    done = _cli(s, "consume", "--subscription", "project-view-projector", "--until-idle", "3")
    assert done.returncode == 0, done.stderr[-3000:]

    listed = orjson.loads(_cli(s, "projects", "list", "--json").stdout)
    projects = sorted({e.project_id for e in events})
    assert [p["projectId"] for p in listed] == projects
    assert {p["events"] for p in listed} == {15} and {p["highSlot"] for p in listed} == {15}
    table = _cli(s, "projects", "list").stdout.splitlines()
    assert table[0].split() == [
        "PROJECT", "STREAM[PARTITION]", "EVENTS", "APPLIED", "HIGH", "SLOT", "GAP", "LAST", "EVENT"
    ]  # fmt: skip
    assert [row.split()[0] for row in table[1:-1]] == projects
    assert table[-1] == "3 projects, 45 events applied; 0 with a gap in their slots"

    # The reader is gone before the first byte: every write the command makes meets a closed
    # pipe, deterministically (the read end is closed before the process starts).
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        closed = subprocess.run(
            [sys.executable, "-m", "router.cli", "feed", projects[0]],
            cwd=ROOT,
            env=subprocess_env(s),
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            check=False,
        )
    finally:
        os.close(write_end)
    assert closed.stderr == "" and closed.returncode == 141, closed.stderr
