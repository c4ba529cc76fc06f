"""The project stands on its own: no file of it points at a document outside the repository
(an internal design note, the source documents the project was first described in). What a user
needs is in ``docs/``; links to public specifications are fine."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Each names an outside document, or a sentence that leans on one.
OUTSIDE = re.compile(
    r"DESIGN\.md"
    r"|shared/(?:seeds|STYLE)"
    r"|\bseeds?[ _-]?0\d\d\b"  # "seed 004", "seed-002"
    r"|\b\d{3}_[0-9a-f]{16}\b"  # a source document's file name
    r"|\bthe seeds\b"
    r"|\bseed's\b",
    re.IGNORECASE,
)


def _tracked() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.split(b"\0")
    return [ROOT / name.decode() for name in listed if name]


def test_no_file_points_outside_the_repository() -> None:
    found = []
    for path in _tracked():
        if path == Path(__file__).resolve() or not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if OUTSIDE.search(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:100]}")
    assert not found, "files that cite documents outside the project:\n" + "\n".join(found)


def test_the_pattern_catches_what_it_must() -> None:
    caught = [
        "see " + "DESIGN" + ".md §5",  # spelled in pieces: this file cites nothing
        "the trap of seed 004",
        "Seed-002's processor contract",
        "from 004_e1d9acb7d5977b50.txt",
        "as the seed's table reads",
        "the seeds' services",
        "/work/shared/seeds/README.md",
    ]
    passed = ["redis cluster seeds: 127.0.0.1:7000", "hypothesis draws from the seed", "seed=7"]
    assert all(OUTSIDE.search(text) for text in caught)
    assert not any(OUTSIDE.search(text) for text in passed)
