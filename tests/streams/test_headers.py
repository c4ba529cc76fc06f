"""The header vocabulary: one module names every header, reading falls back to the legacy names
the dead-letter store's topic still holds, and no other module spells a header of ours."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from streams import headers
from streams.headers import (
    ATTEMPTS,
    ERROR,
    LEGACY,
    OPERATOR_RETRY,
    ORIGIN_OFFSET,
    ORIGIN_TOPIC,
    PREFIX,
    RECORD_ID,
    header,
    header_dict,
    header_int,
    header_text,
    is_ours,
)

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("router", "consumers", "streams")
VOCABULARY = ROOT / "streams" / "headers.py"
OURS = (PREFIX, "dlq.")


def _spelled_in(source: str, where: str) -> list[str]:
    """``where:line: 'name'`` for each string constant (f-string parts too) naming ours."""
    return [
        f"{where}:{node.lineno}: {node.value!r}"
        for node in ast.walk(ast.parse(source, filename=where))
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and node.value.startswith(OURS)
    ]


def test_no_module_but_streams_headers_spells_a_header_of_ours() -> None:
    found = [
        hit
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        if path != VOCABULARY
        for hit in _spelled_in(path.read_text(), str(path.relative_to(ROOT)))
    ]
    assert not found, (
        "header names of ours are written only in streams/headers.py; import the constant "
        "instead at:\n  " + "\n  ".join(found)
    )


def test_the_scan_names_the_file_and_line_of_a_literal_or_an_f_string() -> None:
    source = 'x = 1\nname = f"rh.{x}"\nold = ("dlq.reason", b"")\nkey = "rh:unit:claims"\n'
    assert _spelled_in(source, "m.py") == ["m.py:2: 'rh.'", "m.py:3: 'dlq.reason'"]


def test_every_name_is_one_constant_and_every_legacy_name_maps_to_a_current_one() -> None:
    names = [
        v for k, v in vars(headers).items() if k.isupper() and isinstance(v, str) and k != "PREFIX"
    ]
    assert len(names) == len(set(names)), "two constants name the same header"
    for old, new in LEGACY.items():
        assert not old.startswith(PREFIX) and new.startswith(PREFIX) and new in names, old
    assert all(is_ours(n) for n in LEGACY)
    assert not is_ours(RECORD_ID) and not is_ours("traceparent")


@pytest.mark.parametrize(
    "carried",
    [
        [(ERROR, b"new"), ("dlq.reason", b"old")],
        [("dlq.reason", b"old"), (ERROR, b"new")],
    ],
)
def test_the_current_name_wins_over_a_legacy_one_wherever_it_stands(
    carried: list[tuple[str, bytes]],
) -> None:
    assert header(carried, ERROR) == b"new"
    assert header_dict(carried) == {ERROR: b"new"}


def test_a_record_with_only_legacy_names_reads_as_the_current_ones() -> None:
    carried = [
        ("dlq.reason", b"boom"),
        ("dlq.attempts", b"5"),
        ("dlq.source_topic", b"rhumbatron_events_00_unit"),
        ("dlq.source_offset", b"3"),
    ]
    assert header_text(carried, ERROR) == "boom"
    assert header_int(carried, ATTEMPTS, 1) == 5
    assert header_text(carried, ORIGIN_TOPIC) == "rhumbatron_events_00_unit"
    assert header_int(carried, ORIGIN_OFFSET, -1) == 3
    assert header_dict(carried) == {
        ERROR: b"boom",
        ATTEMPTS: b"5",
        ORIGIN_TOPIC: b"rhumbatron_events_00_unit",
        ORIGIN_OFFSET: b"3",
    }


def test_reading_takes_the_first_value_and_survives_junk() -> None:
    carried = [(ATTEMPTS, b"2"), (ATTEMPTS, b"7"), (ORIGIN_OFFSET, b"-x"), (ERROR, b"\xff")]
    assert header(carried, ATTEMPTS) == b"2" and header_dict(carried)[ATTEMPTS] == b"2"
    assert header_int(carried, ORIGIN_OFFSET, 9) == 9
    assert header_int(carried, OPERATOR_RETRY, 1) == 1
    assert header_text(carried, ERROR) == "\ufffd"
    assert header_text(carried, OPERATOR_RETRY) is None
