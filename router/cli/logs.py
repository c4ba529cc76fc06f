"""Where the command line's log records go, and in which form (``RHUMBATRON_LOG_FORMAT``).

- ``text`` (the default): one readable line per record, ``<time> <LEVEL> <logger>: <message>``.
- ``json``: one JSON object per line, for a log pipeline: ``ts`` (ISO-8601, UTC), ``level``,
  ``logger``, ``message``, then ``trace_id`` and ``span_id`` when a span was current, the
  ``subscription``, ``topic``, ``partition``, ``offset`` (and the worker's ``queue`` and
  ``command_id``) where the work set them (:func:`streams.log_context.log_fields`), any other
  field the call passed with ``extra=``, and ``exc``: the formatted traceback, when there is one.

Both go to stderr; stdout stays the command's own output. A record's message is what the code
wrote: no secret is ever put into one (settings show theirs masked, URLs without passwords).
"""

from __future__ import annotations

import logging
import sys
from datetime import UTC, datetime
from typing import Any, Literal

import orjson

from streams.kafka_config import LIBRDKAFKA_LOGGER
from streams.log_context import ContextFilter

LogFormat = Literal["text", "json"]

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# The fields the JSON lines lead with, after the four every line has.
_PLACED = ("trace_id", "span_id", "subscription", "topic", "partition", "offset")
# What every LogRecord carries of its own: not an ``extra=`` field of the call.
_RECORD_ATTRIBUTES = frozenset(vars(logging.makeLogRecord({}))) | {
    "message",
    "asctime",
    "taskName",
}


class JsonFormatter(logging.Formatter):
    """One record as one line of JSON (no newline inside: a traceback is escaped)."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC)
            .isoformat(timespec="milliseconds")
            .replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = record.__dict__
        for name in _PLACED:
            if fields.get(name) is not None:
                line[name] = fields[name]
        for name, value in fields.items():
            if name not in _RECORD_ATTRIBUTES and name not in line:
                line[name] = value
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exc"] = record.exc_text
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        # default=str: a field orjson cannot write (a path, a SecretStr, shown masked) is its str.
        return orjson.dumps(line, default=str).decode()


def configure(*, verbose: bool) -> logging.Handler | None:
    """Log to stderr in the text form, at INFO with ``verbose`` and WARNING without, as
    ``logging.basicConfig`` would: nothing changes if the root logger has a handler already (a
    test's, an embedding program's). Returns the handler installed, for :func:`use_format` once
    the settings are known; the settings are read after this, so that whatever logs while they
    load is shown too."""
    if not verbose:
        # librdkafka reports every refused connection; our own errors say it once, better.
        LIBRDKAFKA_LOGGER.setLevel(logging.CRITICAL)
    root = logging.getLogger()
    if root.handlers:
        return None
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(TEXT_FORMAT))
    root.addHandler(handler)
    root.setLevel(logging.INFO if verbose else logging.WARNING)
    return handler


def use_format(handler: logging.Handler | None, log_format: LogFormat) -> None:
    """Switch the handler :func:`configure` installed to ``log_format`` (the setting)."""
    if handler is None or log_format == "text":
        return
    handler.setFormatter(JsonFormatter())
    handler.addFilter(ContextFilter())
