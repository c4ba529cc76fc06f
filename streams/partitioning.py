"""The partitioning vectors: where a project's events go, worked out for a set of project ids, for
a writer or a reader in another language to check its own hashing against.

``python -m streams.partitioning`` (re)writes ``schemas/partitioning.json``; with ``--check`` it
writes nothing and exits 1 when the file differs from what it would write (``make check`` runs
it). The rule is :mod:`streams.topology`'s: ``stream = fnv1a32(utf8(project_id)) mod streams``,
then inside the stream's topic ``partition = (murmur2(utf8(project_id)) & 0x7fffffff) mod
partitions`` (the Java client's default partitioner; librdkafka's ``murmur2_random``).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from streams.topology import fnv1a32, murmur2, partition_for, stream_index

VECTORS_FILE = Path(__file__).resolve().parent.parent / "schemas" / "partitioning.json"

# The default of the ``streams`` setting: an environment's stream count is part of the wire
# contract, and every environment made with the defaults has eight.
VECTOR_STREAMS = 8
# Partition counts a reader may meet: one, small odd and even ones, and powers of two up to a
# count where the high bits of the hash matter.
PARTITION_COUNTS = (1, 2, 3, 8, 16, 32, 256)

# Project ids the envelope allows (1 to 200 characters, no control character), chosen to cover
# what an implementation gets wrong: every murmur2 tail length (1 to 8 bytes), the shortest and
# longest ids, multi-byte UTF-8 (2, 3 and 4 bytes a character), an emoji sequence joined by
# U+200D, and the same letter precomposed and combined (two ids, two hashes: nothing normalizes).
PROJECT_IDS: tuple[str, ...] = (
    "a",
    "ab",
    "abc",
    "abcd",
    "abcde",
    "proj-1",
    "proj-12",
    "proj-123",
    "foobar",
    "proj-0001",
    "acme-billing",
    "tenant-7/project-42",
    "My Project (staging)",
    "0",
    "~",
    "é",
    "e\u0301",
    "café",
    "cafe\u0301",
    "日本",
    "プロジェクト-1",
    "🚀",
    "proj-🚀",
    "👩\u200d👩\u200d👧",
    "Ωmega-Δ",
    ("proj-" + "0123456789abcdef" * 13)[:200],
    "é" * 200,
    "日" * 200,
    "🚀" * 200,
)


def vector(project_id: str) -> dict[str, Any]:
    raw = project_id.encode("utf-8")
    return {
        "project_id": project_id,
        "utf8_hex": raw.hex(),
        "fnv1a32": fnv1a32(project_id),
        "stream": stream_index(project_id, VECTOR_STREAMS),
        "murmur2": murmur2(raw),
        "partitions": {str(n): partition_for(project_id, n) for n in PARTITION_COUNTS},
    }


def document() -> dict[str, Any]:
    return {
        "description": (
            "Where a project's events go. stream = fnv1a32(utf8(project_id)) mod streams (the "
            f"environment's stream count; 'stream' below is for {VECTOR_STREAMS}), the topic "
            "rhumbatron_events_<stream, two digits>_<env>; inside it, partition = "
            "(murmur2(utf8(project_id)) & 0x7fffffff) mod partitions (the record key is the "
            "project id). fnv1a32 and murmur2 are unsigned 32-bit values. Ids are hashed as "
            "given, never normalized. Written by python -m streams.partitioning; see "
            "docs/contract.md."
        ),
        "algorithms": {
            "stream": "FNV-1a 32-bit (offset basis 0x811c9dc5, prime 0x01000193) over the UTF-8 "
            "bytes, mod the stream count",
            "partition": "murmur2 of the Java client's Utils.murmur2 (seed 0x9747b28c), masked "
            "with 0x7fffffff, mod the partition count: the Java client's default partitioner "
            "for keyed records, librdkafka's partitioner=murmur2_random",
        },
        "streams": VECTOR_STREAMS,
        "partition_counts": list(PARTITION_COUNTS),
        "vectors": [vector(project_id) for project_id in PROJECT_IDS],
    }


def render() -> str:
    """The file's text: keys in the order written above, non-ASCII ids as themselves
    (``utf8_hex`` settles any doubt about which code points they are)."""
    return json.dumps(document(), indent=2, ensure_ascii=False) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m streams.partitioning", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("path", nargs="?", type=Path, default=VECTORS_FILE)
    parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 if the file is not current"
    )
    args = parser.parse_args(argv)
    path: Path = args.path
    text = render()
    if args.check:
        current = path.read_text(encoding="utf-8") if path.exists() else None
        if current != text:
            print(
                f"{path} is not what the partitioning rule gives: run "
                "`.venv/bin/python -m streams.partitioning` and commit the file",
                file=sys.stderr,
            )
            return 1
        return 0
    path.write_text(text, encoding="utf-8")
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
