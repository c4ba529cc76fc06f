"""The log lines (``RHUMBATRON_LOG_FORMAT``): JSON lines with the context a record was logged in
(the work's fields, the current span's ids, the traceback), the text form as it always was, and
a format that is neither refused at start, naming its variable."""

from __future__ import annotations

import io
import logging
import re
import subprocess
import sys
import threading
from collections.abc import Iterator

import orjson
import pytest
from opentelemetry.sdk.trace import TracerProvider

from router.cli import logs
from router.cli.main import main
from streams.log_context import ContextFilter, current_fields, log_fields
from tests.support.environment import ROOT

TEXT_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (WARNING|INFO) ([\w.]+): (.*)$")
ISO_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


@pytest.fixture
def lines() -> Iterator[tuple[logging.Logger, io.StringIO]]:
    """A logger of its own writing JSON lines to a buffer, through the filter the command line
    puts on its handler."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    logs.use_format(handler, "json")
    logger = logging.getLogger("rhumbatron.test_logs")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        yield logger, out
    finally:
        logger.removeHandler(handler)
        logger.propagate = True


def _records(out: io.StringIO) -> list[dict[str, object]]:
    return [orjson.loads(line) for line in out.getvalue().splitlines()]


def test_a_json_line_carries_the_work_s_fields_the_call_s_extra_and_no_span_when_none_is_current(
    lines: tuple[logging.Logger, io.StringIO],
) -> None:
    logger, out = lines
    with log_fields(subscription="ledger", topic="rhumbatron_events_03_t", partition=3):
        with log_fields(offset=41):
            logger.warning("event %s failed", "e-1", extra={"attempt": 2})
        logger.info("between events")
    logger.info("outside")
    first, second, third = _records(out)
    assert list(first)[:4] == ["ts", "level", "logger", "message"]
    assert ISO_UTC.match(str(first["ts"])), first["ts"]
    assert first == {
        "ts": first["ts"],
        "level": "WARNING",
        "logger": "rhumbatron.test_logs",
        "message": "event e-1 failed",
        "subscription": "ledger",
        "topic": "rhumbatron_events_03_t",
        "partition": 3,
        "offset": 41,
        "attempt": 2,
    }
    assert "offset" not in second and second["partition"] == 3
    assert set(third) == {"ts", "level", "logger", "message"}
    assert current_fields() == {}


def test_a_json_line_names_the_current_span_and_carries_the_traceback(
    lines: tuple[logging.Logger, io.StringIO],
) -> None:
    logger, out = lines
    tracer = TracerProvider().get_tracer("test")  # local: the global provider is left alone
    with tracer.start_as_current_span("process rhumbatron_events_00_t") as span:
        try:
            raise ValueError("the reason\nover two lines")
        except ValueError:
            logger.exception("apply failed")
    (line,) = out.getvalue().splitlines()  # one line, the traceback's newlines escaped
    record = orjson.loads(line)
    context = span.get_span_context()
    assert record["trace_id"] == f"{context.trace_id:032x}"
    assert record["span_id"] == f"{context.span_id:016x}"
    assert record["level"] == "ERROR" and record["message"] == "apply failed"
    exc = str(record["exc"])
    assert exc.startswith("Traceback (most recent call last):")
    assert exc.endswith("ValueError: the reason\nover two lines")


def test_fields_set_in_one_thread_are_not_seen_in_another() -> None:
    seen: list[object] = []
    with log_fields(subscription="ledger"):
        thread = threading.Thread(target=lambda: seen.append(dict(current_fields())))
        thread.start()
        thread.join()
        record = logging.makeLogRecord({"msg": "here", "subscription": "given"})
        ContextFilter().filter(record)
    assert seen == [{}]
    assert record.__dict__["subscription"] == "given"  # what the call passed wins over the context


def _logging_child(log_format: str) -> list[str]:
    """A process that sets its logging up as the command line does, then logs two records and
    one from librdkafka (which only -v shows)."""
    script = (
        "import logging\n"
        "from router.cli import logs\n"
        "from streams.log_context import log_fields\n"
        "handler = logs.configure(verbose=False)\n"
        f"logs.use_format(handler, {log_format!r})\n"
        "log = logging.getLogger('rhumbatron.runtime')\n"
        "log.info('not shown without -v')\n"
        "logging.getLogger('rhumbatron.librdkafka').error('FAIL|refused')\n"
        "with log_fields(subscription='ledger', partition=1):\n"
        "    log.warning('ledger: %s at %d failed', 'e-1', 7)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert done.stdout == ""
    return done.stderr.splitlines()


def test_the_text_form_is_the_one_line_it_always_was() -> None:
    (line,) = _logging_child("text")
    found = TEXT_LINE.match(line)
    assert found is not None, line
    assert found.groups() == ("WARNING", "rhumbatron.runtime", "ledger: e-1 at 7 failed")


def test_the_json_form_keeps_the_levels_and_the_librdkafka_rule() -> None:
    (line,) = _logging_child("json")
    record = orjson.loads(line)
    assert (record["level"], record["logger"], record["message"]) == (
        "WARNING",
        "rhumbatron.runtime",
        "ledger: e-1 at 7 failed",
    )
    assert (record["subscription"], record["partition"]) == ("ledger", 1)


def test_main_switches_to_json_lines_once_the_setting_is_read(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [])  # as in a process of its own: nothing installed
    monkeypatch.setattr(root, "level", root.level)
    monkeypatch.setenv("RHUMBATRON_LOG_FORMAT", "json")
    assert main(["-v", "config", "show", "--json"]) == 0
    capsys.readouterr()
    logging.getLogger("rhumbatron.test_logs").info("after start")
    record = orjson.loads(capsys.readouterr().err)
    assert (record["level"], record["message"]) == ("INFO", "after start")


def test_a_log_format_that_is_neither_is_refused_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("RHUMBATRON_LOG_FORMAT", "yaml")
    assert main(["config", "show"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        "rhumbatron: invalid setting: RHUMBATRON_LOG_FORMAT='yaml': Input should be 'text' or "
        "'json'; fix the value, or unset it for its default\n"
    )
