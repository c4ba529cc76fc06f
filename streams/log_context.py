"""Fields every log record carries while a piece of work runs: the subscription, topic, partition
and offset a runtime is on, the queue and command a worker is on, and the current span's trace
and span ids.

The work says once where it is (``with log_fields(subscription=slug, topic=..., partition=...)``)
and every record logged inside it, by any module, carries those fields; a formatter that wants
them (the JSON lines of ``RHUMBATRON_LOG_FORMAT=json``) reads them off the record, put there by
:class:`ContextFilter`. The fields live in a context variable, so each thread (and each task)
has its own: a pool thread starts with none, and sets its own.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from types import MappingProxyType

from opentelemetry import trace

_NONE: Mapping[str, object] = MappingProxyType({})
_FIELDS: ContextVar[Mapping[str, object]] = ContextVar("rhumbatron_log_fields", default=_NONE)


@contextmanager
def log_fields(**fields: object) -> Iterator[None]:
    """Every record logged inside carries ``fields`` (on top of those of an enclosing
    ``log_fields``, an inner value winning); a field given as None is left out."""
    merged = dict(_FIELDS.get())
    for name, value in fields.items():
        if value is None:
            merged.pop(name, None)
        else:
            merged[name] = value
    token = _FIELDS.set(MappingProxyType(merged))
    try:
        yield
    finally:
        _FIELDS.reset(token)


def current_fields() -> Mapping[str, object]:
    """The fields a record logged here and now would carry (without the span's ids)."""
    return _FIELDS.get()


class ContextFilter(logging.Filter):
    """Copies the current :func:`log_fields` and, when a valid span is current, its
    ``trace_id`` and ``span_id`` (lower-case hex, as W3C trace context writes them) onto each
    record it sees. A field the call passed itself (``extra=``) wins. Attached to a handler,
    it runs in the thread that logged, so it sees that thread's context."""

    def filter(self, record: logging.LogRecord) -> bool:
        for name, value in _FIELDS.get().items():
            if name not in record.__dict__:
                setattr(record, name, value)
        span = trace.get_current_span().get_span_context()
        if span.is_valid and "trace_id" not in record.__dict__:
            record.trace_id = format(span.trace_id, "032x")
            record.span_id = format(span.span_id, "016x")
        return True
