"""A feed's identity and the checkpoint bound to it.

Every feed response names the corpus it serves and the lineage of that corpus's history
(``X-Corpus-Id``, ``X-Corpus-Lineage``: canonical lowercase UUIDs). A sequence means something
only within one corpus and lineage, so the checkpoint carries the pair with the sequence, and
a page whose pair is not the checkpoint's is never published."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

import orjson

from streams.errors import CheckpointError, FeedIdentityError

CORPUS_ID = "X-Corpus-Id"
CORPUS_LINEAGE = "X-Corpus-Lineage"
EXPECTED_CORPUS_ID = "X-Expected-Corpus-Id"
EXPECTED_CORPUS_LINEAGE = "X-Expected-Corpus-Lineage"

_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def is_uuid(value: object) -> bool:
    """A canonical lowercase UUID (8-4-4-4-12 hex digits)."""
    return isinstance(value, str) and _UUID.fullmatch(value) is not None


@dataclass(frozen=True, slots=True)
class Identity:
    corpus_id: str
    lineage: str

    def __post_init__(self) -> None:
        for name, value in (("corpus id", self.corpus_id), ("lineage", self.lineage)):
            if not is_uuid(value):
                raise FeedIdentityError(f"the {name} {value!r} is not a canonical lowercase UUID")

    def __str__(self) -> str:
        return f"corpus {self.corpus_id} lineage {self.lineage}"

    def expected_headers(self) -> dict[str, str]:
        return {EXPECTED_CORPUS_ID: self.corpus_id, EXPECTED_CORPUS_LINEAGE: self.lineage}


def identity_of(headers: Mapping[str, str]) -> Identity:
    """The authoritative pair a response carries (header names in any case). Missing, empty,
    not a UUID, or only one of the two: FeedIdentityError naming what was found."""
    found = {k.lower(): v for k, v in headers.items()}
    corpus, lineage = found.get(CORPUS_ID.lower()), found.get(CORPUS_LINEAGE.lower())
    if corpus is None or lineage is None:
        missing = [n for n, v in ((CORPUS_ID, corpus), (CORPUS_LINEAGE, lineage)) if v is None]
        raise FeedIdentityError(
            f"the feed's response has no {' and no '.join(missing)} header: its identity is "
            f"missing (found {CORPUS_ID}={corpus!r}, {CORPUS_LINEAGE}={lineage!r})"
        )
    if not (is_uuid(corpus) and is_uuid(lineage)):
        raise FeedIdentityError(
            f"the feed's identity is malformed: {CORPUS_ID}={corpus!r}, "
            f"{CORPUS_LINEAGE}={lineage!r} (each must be a canonical lowercase UUID)"
        )
    return Identity(corpus, lineage)


def check_same(expected: Identity, found: Identity) -> None:
    if found != expected:
        what = [
            name
            for name, a, b in (
                ("corpus id", expected.corpus_id, found.corpus_id),
                ("lineage", expected.lineage, found.lineage),
            )
            if a != b
        ]
        raise FeedIdentityError(
            f"the feed answered as {found}, the checkpoint is for {expected} "
            f"({' and '.join(what)} differ): nothing published, the checkpoint unchanged "
            "(docs/pump.md: a lineage change)"
        )


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """Version 1: the last sequence Kafka accepted, within one corpus and lineage."""

    identity: Identity
    sequence: int

    VERSION = 1

    def __post_init__(self) -> None:
        if type(self.sequence) is not int or self.sequence < 0:
            raise CheckpointError(
                f"a checkpoint's sequence must be an integer >= 0, not {self.sequence!r}"
            )

    def to_json(self) -> bytes:
        return orjson.dumps(
            {
                "version": self.VERSION,
                "corpus_id": self.identity.corpus_id,
                "history_lineage": self.identity.lineage,
                "sequence": self.sequence,
            }
        )

    def as_dict(self) -> dict[str, object]:
        return orjson.loads(self.to_json())  # type: ignore[no-any-return]

    def advanced(self, sequence: int) -> Checkpoint:
        return Checkpoint(self.identity, sequence)

    @classmethod
    def parse(cls, raw: bytes, *, where: str) -> Checkpoint:
        """A stored checkpoint; anything but a whole version 1 is a CheckpointError naming
        ``where`` it was read and what is wrong."""
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise CheckpointError(f"{where}: the checkpoint is not JSON ({exc})") from exc
        if not isinstance(obj, dict):
            raise CheckpointError(f"{where}: the checkpoint must be a JSON object, not {obj!r:.60}")
        if obj.get("version") != cls.VERSION:
            raise CheckpointError(
                f"{where}: checkpoint version {obj.get('version')!r} is not supported (1 is)"
            )
        keys = {"version", "corpus_id", "history_lineage", "sequence"}
        if set(obj) != keys:
            raise CheckpointError(
                f"{where}: a version 1 checkpoint has exactly the fields {sorted(keys)}, "
                f"found {sorted(obj)}"
            )
        try:
            return cls(Identity(obj["corpus_id"], obj["history_lineage"]), obj["sequence"])
        except (FeedIdentityError, CheckpointError) as exc:
            raise CheckpointError(f"{where}: {exc}") from exc
