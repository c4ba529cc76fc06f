"""schemas/partitioning.json, the partitioning vectors other languages check their hashing
against: the checked-in file is what the generator writes, its hashes are the published FNV-1a
values, every id is one the envelope allows, and the partitions it names are where the real
broker puts a record keyed by the project id when our producer sends it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import NewTopic
from pydantic import TypeAdapter

from router.settings import Settings
from streams.admin import admin_client
from streams.envelopes import Name
from streams.partitioning import (
    PARTITION_COUNTS,
    PROJECT_IDS,
    VECTOR_STREAMS,
    VECTORS_FILE,
    main,
    render,
)
from streams.producer import DeliveryReport, Producer
from streams.topology import fnv1a32
from tests.support.environment import ROOT


def _vectors() -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = json.loads(VECTORS_FILE.read_text(encoding="utf-8"))["vectors"]
    return found


def test_the_checked_in_file_is_what_the_generator_writes() -> None:
    assert VECTORS_FILE.read_text(encoding="utf-8") == render()
    assert VECTORS_FILE == ROOT / "schemas" / "partitioning.json"


def test_check_mode_refuses_a_stale_file_and_writes_nothing(tmp_path: Path) -> None:
    stale = tmp_path / "partitioning.json"
    stale.write_text(render().replace('"stream": 4', '"stream": 5', 1), encoding="utf-8")
    before = stale.read_text(encoding="utf-8")
    assert main(["--check", str(stale)]) == 1
    assert stale.read_text(encoding="utf-8") == before
    assert main(["--check", str(tmp_path / "missing.json")]) == 1
    assert main([str(stale)]) == 0
    assert main(["--check", str(stale)]) == 0


def test_the_command_line_check_passes_on_the_checked_in_file() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "streams.partitioning", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr


def test_the_vectors_cover_what_implementations_get_wrong() -> None:
    vectors = _vectors()
    assert [v["project_id"] for v in vectors] == list(PROJECT_IDS)
    assert len(set(PROJECT_IDS)) == len(PROJECT_IDS)
    lengths = {len(v["project_id"]) for v in vectors}
    assert 1 in lengths and 200 in lengths
    # every murmur2 tail, and 2-, 3- and 4-byte UTF-8 characters
    assert {len(bytes.fromhex(v["utf8_hex"])) for v in vectors} >= set(range(1, 9))
    widths = {len(c.encode()) for v in vectors for c in v["project_id"]}
    assert widths == {1, 2, 3, 4}
    # the same letter precomposed and combined: two ids, hashed as given
    by_id = {v["project_id"]: v for v in vectors}
    assert by_id["é"]["fnv1a32"] != by_id["e\u0301"]["fnv1a32"]
    for v in vectors:
        assert v["utf8_hex"] == v["project_id"].encode("utf-8").hex()
        assert set(v["partitions"]) == {str(n) for n in PARTITION_COUNTS}


def test_every_id_is_one_the_envelope_allows() -> None:
    name = TypeAdapter(Name)
    for project_id in PROJECT_IDS:
        assert name.validate_python(project_id) == project_id


def test_the_vector_stream_count_is_the_settings_default() -> None:
    assert Settings.model_fields["streams"].default == VECTOR_STREAMS


# Published FNV-1a 32-bit values (the Fowler/Noll/Vo reference test suite), over the bytes given.
FNV_PUBLISHED = {
    b"": 0x811C9DC5,
    b"a": 0xE40C292C,
    b"b": 0xE70C2DE5,
    b"c": 0xE60C2C52,
    b"foo": 0xA9F37ED7,
    b"foob": 0x3F5076EF,
    b"fooba": 0x39AAA18A,
    b"foobar": 0xBF9CF968,
    b"chongo was here!\n": 0xD49930D5,
}


@pytest.mark.parametrize(("data", "expected"), FNV_PUBLISHED.items())
def test_fnv1a32_gives_the_published_values(data: bytes, expected: int) -> None:
    assert fnv1a32(data.decode()) == expected


def test_the_vectors_fnv_and_stream_agree_with_a_plain_reading_of_the_rule() -> None:
    for v in _vectors():
        value = 0x811C9DC5
        for byte in bytes.fromhex(v["utf8_hex"]):
            value = ((value ^ byte) * 0x01000193) % 2**32
        assert v["fnv1a32"] == value, v["project_id"]
        assert v["stream"] == value % VECTOR_STREAMS, v["project_id"]


@pytest.mark.integration
@pytest.mark.parametrize("partitions", [3, 8])
def test_the_broker_puts_each_vector_where_the_file_says(
    settings: Settings, partitions: int
) -> None:
    base = settings.kafka_config()
    topic = f"partitioning_{partitions}_{settings.env}"  # removed with the environment
    admin = admin_client(base)
    [created] = admin.create_topics([NewTopic(topic, partitions, 1)]).values()
    created.result()
    placed: dict[str, int] = {}

    def delivered(report: DeliveryReport) -> None:
        assert report.ok, report.describe_error()
        assert report.key is not None
        placed[report.key] = report.partition

    producer = Producer(base)
    try:
        for v in _vectors():
            producer.produce(topic, b"{}", key=v["project_id"], on_delivery=delivered)
        producer.flush(60)
    finally:
        producer.close()
    expected = {v["project_id"]: v["partitions"][str(partitions)] for v in _vectors()}
    assert placed == expected
    assert len(set(placed.values())) > 1  # the ids really are spread over the partitions
