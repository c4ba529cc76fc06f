"""Hostile records on a real stream (tests/support/hostile.py: garbage, no value, JSON of other
shapes, an event cut short, nesting too deep, an event over the limit, headers with no value, not
UTF-8, given twice, our own names lying, huge, a record near the broker's limit), written by a
raw producer between real events of the same project. A ledger run to idle dead-letters each as
poison once, its letter and its record on the dead-letter topic holding its bytes and headers as
they came (the record near the broker's limit, too large for the topic with the letter's headers,
goes there without them, the letter's index holding it whole), and applies every real event once,
in slot order."""

from __future__ import annotations

from collections import Counter

import pytest

from consumers.subscriptions.ledger import read_ledger
from router.settings import Settings
from router.wiring.provisioning import provision_environment
from router.wiring.subscription import dead_letters, redis_client
from streams.headers import DEAD_LETTER_CUT, DEAD_LETTER_ID, header, is_ours
from streams.topology import dead_letter_topic
from streams.workload import slotted_events, workload
from tests.support import hostile
from tests.support.kafka import read_all
from tests.support.runtime_processes import consume_cli, publish, runtime_settings

pytestmark = pytest.mark.integration


def test_hostile_records_are_dead_lettered_as_they_came_and_real_events_applied(
    settings: Settings,
) -> None:
    s = runtime_settings(settings, batch_size=20)
    provision_environment(s)
    events = slotted_events(workload("hostile", 3, 60), tenant_id="t")
    project = events[0].project_id
    topic, partition = s.topology.partition_of(project)
    mine = [e for e in events if e.project_id == project]
    records = hostile.catalog(project, s.max_envelope_bytes)
    publish(s, mine[:5])
    hostile.write(s.kafka_bootstrap, topic, partition, project, records)
    publish(s, [e for e in events if e not in mine[:5]])

    done = consume_cli(s, "ledger", until_idle=3, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]

    ledger = read_ledger(redis_client(s), s.env)
    assert ledger["projects"][project] == [e.slot for e in mine]
    assert sorted(ledger["counts"]) == sorted(e.event_id for e in events)
    assert set(ledger["counts"].values()) == {1}

    letters = sorted(dead_letters(s, redis_client(s)).list(), key=lambda d: d.offsets)
    assert [d.kind for d in letters] == ["poison"] * len(records), [d.summary() for d in letters]
    for record, letter in zip(records, letters, strict=True):
        (entry,) = letter.entries
        assert (letter.source_topic, letter.source_partition) == (topic, partition)
        assert entry.value == record.value, record.name
        assert entry.headers == record.headers, record.name
        assert letter.attempts == 1 and letter.error.strip(), record.name

    # The durable record: each original value under its letter's id, the original headers kept.
    tee = read_all(s.kafka_bootstrap, [dead_letter_topic(s.env)], expect=len(records))
    by_letter = {(header(hostile.headers_of(m), DEAD_LETTER_ID) or b"").decode(): m for m in tee}
    assert sorted(by_letter) == sorted(d.id for d in letters)
    cut = []
    for record, letter in zip(records, letters, strict=True):
        message = by_letter[letter.id]
        assert header(hostile.headers_of(message), DEAD_LETTER_ID) == letter.id.encode()
        if header(hostile.headers_of(message), DEAD_LETTER_CUT) is not None:
            # Too large for the topic with the letter's headers: there without its bytes, which
            # the index holds whole (checked above).
            cut.append(record.name)
            assert message.value() in (b"", None), record.name
            continue
        assert message.value() == (record.value or b""), record.name
        # Under the letter's own names (rh.*) the letter's values stand; every other header is
        # there as it came, repeats included.
        theirs = Counter(h for h in record.headers if not is_ours(h[0]))
        assert Counter(hostile.headers_of(message)) & theirs == theirs, record.name
    assert cut == ["near-the-raw-limit"]
