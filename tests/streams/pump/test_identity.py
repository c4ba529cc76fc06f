"""A feed's identity headers and the version 1 checkpoint: every malformed, missing or other
pair refused with both pairs named; a checkpoint read back only when it is a whole version 1."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from streams.errors import CheckpointError, FeedIdentityError
from streams.pump.identity import Checkpoint, Identity, check_same, identity_of
from tests.support.pump import CORPUS, IDENTITY, LINEAGE, OTHER


def test_a_complete_pair_is_the_identity_in_any_header_case() -> None:
    assert identity_of({"x-corpus-id": CORPUS, "X-CORPUS-LINEAGE": LINEAGE}) == IDENTITY


@pytest.mark.parametrize(
    ("headers", "says"),
    [
        ({}, "no X-Corpus-Id and no X-Corpus-Lineage header"),
        ({"X-Corpus-Id": CORPUS}, "no X-Corpus-Lineage header"),
        ({"X-Corpus-Lineage": LINEAGE}, "no X-Corpus-Id header"),
        ({"X-Corpus-Id": "", "X-Corpus-Lineage": LINEAGE}, "malformed"),
        (
            {"X-Corpus-Id": "AAAAAAAA-1111-4111-8111-111111111111", "X-Corpus-Lineage": LINEAGE},
            "malformed",
        ),
        ({"X-Corpus-Id": CORPUS, "X-Corpus-Lineage": "not-a-uuid"}, "malformed"),
        ({"X-Corpus-Id": "{" + CORPUS + "}", "X-Corpus-Lineage": LINEAGE}, "malformed"),
    ],
)
def test_a_missing_or_malformed_pair_is_refused_naming_what_was_found(
    headers: dict[str, str], says: str
) -> None:
    with pytest.raises(FeedIdentityError, match=says) as refused:
        identity_of(headers)
    for value in headers.values():
        assert repr(value) in str(refused.value)


@pytest.mark.parametrize(
    ("found", "differ"),
    [
        (Identity(OTHER, LINEAGE), "corpus id differ"),
        (Identity(CORPUS, OTHER), "lineage differ"),
        (Identity(OTHER, CORPUS), "corpus id and lineage differ"),
    ],
)
def test_another_pair_is_refused_naming_both(found: Identity, differ: str) -> None:
    with pytest.raises(FeedIdentityError, match=differ) as refused:
        check_same(IDENTITY, found)
    text = str(refused.value)
    assert str(IDENTITY) in text and str(found) in text
    check_same(IDENTITY, Identity(CORPUS, LINEAGE))  # the same pair passes


@given(st.integers(0, 2**63 - 1))
def test_a_checkpoint_reads_back_as_written(sequence: int) -> None:
    checkpoint = Checkpoint(IDENTITY, sequence)
    raw = checkpoint.to_json()
    assert orjson.loads(raw) == {
        "version": 1,
        "corpus_id": CORPUS,
        "history_lineage": LINEAGE,
        "sequence": sequence,
    }
    assert Checkpoint.parse(raw, where="t") == checkpoint


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        (b"42", "must be a JSON object"),
        (b"{", "not JSON"),
        (b'{"version": 2, "corpus_id": "a", "history_lineage": "b", "sequence": 1}', "version 2"),
        (
            b'{"version": 1, "corpus_id": "%s", "sequence": 1}' % CORPUS.encode(),
            "exactly the fields",
        ),
        (
            b'{"version": 1, "corpus_id": "x", "history_lineage": "%s", "sequence": 1}'
            % LINEAGE.encode(),
            "not a canonical lowercase UUID",
        ),
        (
            b'{"version": 1, "corpus_id": "%s", "history_lineage": "%s", "sequence": -1}'
            % (CORPUS.encode(), LINEAGE.encode()),
            "integer >= 0",
        ),
        (
            b'{"version": 1, "corpus_id": "%s", "history_lineage": "%s", "sequence": "7"}'
            % (CORPUS.encode(), LINEAGE.encode()),
            "integer >= 0",
        ),
    ],
)
def test_a_stored_checkpoint_not_a_whole_version_1_is_refused(raw: bytes, says: str) -> None:
    with pytest.raises(CheckpointError, match=says) as refused:
        Checkpoint.parse(raw, where="topic t key k")
    assert "topic t key k" in str(refused.value)
