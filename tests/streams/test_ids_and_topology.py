from __future__ import annotations

import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streams.errors import TopologyError
from streams.ids import derived_command_id, new_event_id, stable_event_id
from streams.topology import (
    QUEUE_NAME_MAX,
    QUEUE_PURPOSES,
    Topology,
    check_queue,
    fnv1a32,
    group_id,
    queue_name,
    stream_index,
    stream_name,
)

# Published FNV-1a 32-bit test vectors (Fowler/Noll/Vo reference set).
FNV_VECTORS = {
    "": 0x811C9DC5,
    "a": 0xE40C292C,
    "b": 0xE70C2DE5,
    "foobar": 0xBF9CF968,
    "chongo was here!\n": 0xD49930D5,
}


@pytest.mark.parametrize(("text", "expected"), FNV_VECTORS.items())
def test_fnv1a32_known_vectors(text: str, expected: int) -> None:
    assert fnv1a32(text) == expected


def test_fnv1a32_is_over_utf8_bytes() -> None:
    # "é" is two UTF-8 bytes: c3 a9
    expected = 0x811C9DC5
    for byte in (0xC3, 0xA9):
        expected = ((expected ^ byte) * 0x01000193) & 0xFFFFFFFF
    assert fnv1a32("é") == expected


def test_stream_index_vectors() -> None:
    assert stream_index("foobar", 8) == 0xBF9CF968 % 8 == 0
    assert stream_index("a", 8) == 0xE40C292C % 8 == 4
    assert stream_index("proj-1", 8) == fnv1a32("proj-1") % 8


def _reference_stable_id(*parts: str | None) -> str:
    h = hashlib.sha256()
    for p in parts:
        if p is None:
            h.update(b"\xff")
        else:
            raw = p.encode()
            h.update(len(raw).to_bytes(4, "big") + raw)
    return "evt_" + h.digest()[:16].hex()


def test_stable_event_id_vectors() -> None:
    assert stable_event_id("chg-1", "task.completed", "task-7") == "evt_" + (
        hashlib.sha256(
            b"\x00\x00\x00\x05chg-1"
            + b"\x00\x00\x00\x0etask.completed"
            + b"\x00\x00\x00\x06task-7"
            + b"\xff"
        )
        .digest()[:16]
        .hex()
    )
    assert stable_event_id("chg-1", "task.completed", "task-7", "k") == _reference_stable_id(
        "chg-1", "task.completed", "task-7", "k"
    )
    # Pinned value: changing the derivation would re-key every stored event.
    assert stable_event_id("c", "t.x", None) == _reference_stable_id("c", "t.x", None, None)


def test_stable_event_id_fields_cannot_run_together() -> None:
    assert stable_event_id("ab", "x.y", "c") != stable_event_id("a", "x.y", "bc")
    assert stable_event_id("c", "x.y", None) != stable_event_id("c", "x.y", "")
    assert stable_event_id("c", "x.y", "t", None) != stable_event_id("c", "x.y", "t", "")


@given(
    st.text(max_size=20),
    st.text(max_size=20),
    st.text(max_size=20) | st.none(),
    st.text(max_size=5) | st.none(),
)
def test_stable_event_id_shape_and_determinism(
    change: str, etype: str, task: str | None, key: str | None
) -> None:
    first = stable_event_id(change, etype, task, key)
    assert first == stable_event_id(change, etype, task, key)
    assert first.startswith("evt_") and len(first) == 36
    int(first[4:], 16)


def test_new_event_id_is_random_with_the_same_shape() -> None:
    ids = {new_event_id() for _ in range(1000)}
    assert len(ids) == 1000
    assert all(i.startswith("evt_") and len(i) == 36 for i in ids)


def test_derived_command_ids_are_stable_and_safe() -> None:
    a = derived_command_id("evt_" + "1" * 32, "agent.wake", "agent-3")
    assert a == derived_command_id("evt_" + "1" * 32, "agent.wake", "agent-3")
    assert a.startswith("cmd_evt_")
    odd = derived_command_id("evt_1", "agent.wake", "path with spaces/é")
    assert " " not in odd and "/" not in odd


def test_stream_names() -> None:
    assert stream_name(0, "dev") == "rhumbatron_events_00_dev"
    assert stream_name(7, "prod") == "rhumbatron_events_07_prod"


@pytest.mark.parametrize("env", ["dev-1", "dev.x", "", "dév", "a b", "x" * 41])
def test_bad_environment_names_are_refused_before_any_call(env: str) -> None:
    with pytest.raises(TopologyError, match="letters, digits and underscores"):
        stream_name(0, env)


def test_queue_names_cover_the_six_queues() -> None:
    assert [queue_name(p, "dev") for p in QUEUE_PURPOSES] == [
        "rhumbatron-agent-wakeups-dev",
        "rhumbatron-integration-dev",
        "rhumbatron-indexing-dev",
        "rhumbatron-verification-dev",
        "rhumbatron-release-dev",
        "rhumbatron-dead-letter-dev",
    ]
    # Any name the grammar allows has a topic; which queues exist is the settings' to say.
    assert queue_name("emails", "dev") == "rhumbatron-emails-dev"
    with pytest.raises(TopologyError, match="queue name 'emails-retry' is not allowed"):
        queue_name("emails-retry", "dev")
    assert group_id("project-view-projector", "dev") == "rhumbatron-project-view-projector-dev"
    with pytest.raises(TopologyError):
        group_id("Bad Slug", "dev")


@pytest.mark.parametrize(
    "name",
    ["payments", "agent-wakeups", "dead-letter", "q2", "eu-west-1-billing", "retry", "retryer",
     "payments-retrying", "a" * QUEUE_NAME_MAX],
)  # fmt: skip
def test_a_queue_name_the_grammar_allows(name: str) -> None:
    assert check_queue(name) == name
    assert queue_name(name, "dev") == f"rhumbatron-{name}-dev"


@pytest.mark.parametrize(
    ("name", "rule"),
    [
        ("", "1 to 40 characters, this one 0"),
        ("a" * (QUEUE_NAME_MAX + 1), "1 to 40 characters, this one 41"),
        ("payments_eu", "lowercase letters, digits and - only (no _"),
        ("Payments", "lowercase letters, digits and - only"),
        ("pay.ments", "lowercase letters, digits and - only"),
        ("paymènts", "lowercase letters, digits and - only"),
        ("9payments", "starts with a letter"),
        ("-payments", "starts with a letter"),
        ("payments-", "a - stands between two letters or digits"),
        ("pay--ments", "a - stands between two letters or digits"),
        ("payments-retry", "neither ends in -retry nor holds -retry-"),
        ("payments-retry-30s", "neither ends in -retry nor holds -retry-"),
        ("payments-retry-eu", "neither ends in -retry nor holds -retry-"),
    ],
)
def test_a_queue_name_the_grammar_refuses_names_the_rule(name: str, rule: str) -> None:
    with pytest.raises(TopologyError) as refused:
        check_queue(name)
    assert str(refused.value).startswith(f"queue name {name!r} is not allowed: ")
    assert rule in str(refused.value)


def test_no_queue_topic_is_another_queues_retry_topic() -> None:
    # What the -retry rule is for: "payments-retry" would be the retry topic of "payments".
    t = _topology(retry_tiers_s=(5, 60))
    names = ["payments", "payments-retrying", "retry", "payments-eu"]
    topics = [n for q in names for n in (queue_name(q, "dev"), *t.retry_topics(q))]
    assert len(topics) == len(set(topics))
    assert t.retry_topics("payments") == [
        "rhumbatron-payments-retry-dev",
        "rhumbatron-payments-retry-5s-dev",
        "rhumbatron-payments-retry-60s-dev",
    ]


def test_a_topology_has_the_queues_it_is_given() -> None:
    assert _topology().queues == QUEUE_PURPOSES
    t = _topology(queues=(*QUEUE_PURPOSES, "payments"))
    assert t.queue_names()[-1] == "rhumbatron-payments-dev"
    assert [s.name for s in t.queue_specs()][-1] == "rhumbatron-payments-dev"
    assert t.known_queue("payments") == "payments"
    with pytest.raises(
        TopologyError,
        match=r"unknown queue 'paymnts'; known: agent-wakeups, .*"
        r"dead-letter, payments \(a queue of your own is \[queues.<name>\]",
    ):
        t.known_queue("paymnts")
    with pytest.raises(TopologyError, match="queue name 'pay_ments' is not allowed"):
        _topology(queues=("pay_ments",))
    with pytest.raises(TopologyError, match="a queue is named twice"):
        _topology(queues=("payments", "payments"))


def _topology(**kw: object) -> Topology:
    values = dict(
        env="dev",
        streams=8,
        partitions=4,
        replication_factor=1,
        stream_retention_ms=604800000,
        queue_retention_ms=86400000,
        queue_partitions=1,
        dead_letter_retention_ms=30 * 86400000,
        max_streams=20,
    )
    values.update(kw)
    return Topology(**values)  # type: ignore[arg-type]


def test_topology_plan() -> None:
    t = _topology()
    assert len(t.stream_specs()) == 8
    assert {s.config["retention.ms"] for s in t.stream_specs()} == {"604800000"}
    assert {s.config["retention.ms"] for s in t.queue_specs()} == {"86400000"}
    assert t.stream_for("foobar") == "rhumbatron_events_00_dev"


def test_topology_refuses_more_than_the_stream_limit() -> None:
    with pytest.raises(TopologyError, match="21 streams exceeds the limit of 20"):
        _topology(streams=21)
    assert (
        _topology(streams=20).count_streams(
            ["rhumbatron_events_00_dev", "rhumbatron_events_00_prod"]
        )
        == 1
    )


# Values of org.apache.kafka.common.utils.Utils.murmur2 (as signed Java ints) for these keys.
MURMUR2_JAVA = {
    "21": -973932308,
    "foobar": -790332482,
    "a-little-bit-long-string": -985981536,
    "a-little-bit-longer-string": -1486304829,
    "lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    "": 275646681,
}


@pytest.mark.parametrize(("key", "java"), MURMUR2_JAVA.items())
def test_murmur2_matches_the_java_client(key: str, java: int) -> None:
    from streams.topology import murmur2

    assert murmur2(key.encode()) == java & 0xFFFFFFFF
