"""The progress reporter of long-running commands: plain lines when not on a terminal, each said
once (an idle process does not fill a log), one live line on a terminal whose last figures stay
shown; the start line names what the command works on."""

from __future__ import annotations

import io
import threading

import pytest

from router.cli.progress import ProgressReporter, start_line
from tests.support.environment import make_settings
from tests.support.waiting import wait_until


class Figures:
    def __init__(self) -> None:
        self.records = 0
        self.asked = threading.Event()
        self.count = 0

    def __call__(self) -> str:
        self.count += 1
        if self.count >= 3:
            self.asked.set()
        return f"{self.records} records"


def test_plain_lines_say_each_new_figure_once() -> None:
    out = io.StringIO()
    figures = Figures()
    with ProgressReporter(figures, 0.01, stream=out, live=False):
        wait_until(figures.asked.is_set, 30, "the reporter asked three times")
        figures.records = 5
        wait_until(lambda: "5 records" in out.getvalue(), 30, "the new figure shown")
    lines = out.getvalue().splitlines()
    assert [line.split(" [")[0] for line in lines] == ["0 records", "5 records"], lines
    assert all(line.endswith("s]") for line in lines)  # with the seconds since the start


def test_a_pushed_line_is_printed_once() -> None:
    out = io.StringIO()
    with ProgressReporter(None, 5, stream=out, live=False) as reporter:
        reporter.show("publish: 3 published")
        reporter.show("publish: 3 published")
    assert out.getvalue() == "publish: 3 published\n"


def test_on_a_terminal_the_last_figures_stay_shown() -> None:
    out = io.StringIO()
    with ProgressReporter(None, 5, stream=out, live=True) as reporter:
        reporter.show("consume ledger: 7 records")
    assert out.getvalue().splitlines()[-1] == "consume ledger: 7 records"


def test_the_start_line_names_the_environment_group_topics_and_state_dir(
    capsys: pytest.CaptureFixture[str],
) -> None:
    s = make_settings(env="dev")
    reads = s.topology.subscription_reads("ledger")
    line = start_line(
        "consume ledger", s, group=reads.group, topics=[*reads.subscribed, *reads.assigned]
    )
    assert line == (
        "consume ledger: env dev, group rhumbatron-ledger-dev, topics rhumbatron_events_00-07_dev, "
        f"rhumbatron_redelivery_ledger_dev (9), state dir {s.state_dir}"
    )
    assert capsys.readouterr().err == line + "\n"
