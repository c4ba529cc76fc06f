"""Deciding an ambiguous resource overlap: should the active agent wake?

When an agent declares resources (intent, challenge, changeset, claim) and another active agent's
resources overlap them only by a directory prefix (``src/api`` vs ``src/api/routes.py``), the
router asks a :class:`Classifier`. Two implementations:

- :class:`HeuristicClassifier` (the default): local and deterministic, from the paths alone;
- :class:`HttpClassifier`: a model endpoint, over HTTP (the contract is below).

:class:`OverlapJudge` puts the rules around either one: at most ``calls_per_day`` calls a day
across every router process (counted in Redis before the call, see ``causal_router.budget``), and an
answer below ``threshold`` probability is an abstention. Abstention, error, timeout and the cap all
mean **wake** — a needless wake costs a little, a missed one a conflict. The cap applies to the
heuristic too, so the router behaves the same whichever classifier is configured.

The count is taken when the judge asks, not when the batch commits: a batch retried after a
failure asks (and counts) again. The count can run high, never low — the safe side of a cap.

HTTP contract (``POST <classifier_url>``, ``Content-Type: application/json``, and
``Authorization: Bearer <classifier_key>`` when a key is set)::

    request  {"kind": "resource-overlap", "projectId": str, "changeId": str | null,
              "eventId": str, "eventType": str,
              "declaring": {"agentId": str, "resources": [path]},
              "active": {"agentId": str, "resources": [path]},
              "overlaps": [{"declared": path, "held": path}]}
    answer   200 {"wake": bool, "probability": number in [0, 1]}

``probability`` is the model's confidence in its ``wake`` answer. Any other status, a body that is
not that object, a bigger body than ``max_answer_bytes``, or no answer within ``timeout_s`` (per
connect and per read) is an error or a timeout, and the agent is woken.
"""

from __future__ import annotations

import http.client
import logging
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any, Protocol
from urllib.parse import urlsplit

import orjson
from pydantic import SecretStr

from consumers.subscriptions.causal_router.budget import DailyCounter
from streams.errors import ClassifierError, ClassifierTimeout
from streams.urls import MASK, masked

log = logging.getLogger("rhumbatron.causal_router.classifier")


@dataclass(frozen=True, slots=True)
class OverlapQuestion:
    project_id: str
    change_id: str | None
    event_id: str
    event_type: str
    declaring_agent: str
    declared: tuple[str, ...]
    active_agent: str
    held: tuple[str, ...]
    overlaps: tuple[tuple[str, str], ...]  # (declared path, held path), one a prefix of the other

    def as_json(self) -> dict[str, Any]:
        return {
            "kind": "resource-overlap",
            "projectId": self.project_id,
            "changeId": self.change_id,
            "eventId": self.event_id,
            "eventType": self.event_type,
            "declaring": {"agentId": self.declaring_agent, "resources": list(self.declared)},
            "active": {"agentId": self.active_agent, "resources": list(self.held)},
            "overlaps": [{"declared": d, "held": h} for d, h in self.overlaps],
        }


@dataclass(frozen=True, slots=True)
class Answer:
    wake: bool
    probability: float


class Classifier(Protocol):
    name: str

    def classify(self, question: OverlapQuestion) -> Answer:
        """Answer, or raise ClassifierError / ClassifierTimeout."""


def _parts(path: str) -> list[str]:
    return [p for p in path.split("/") if p]


class HeuristicClassifier:
    """Deterministic: the same paths always give the same answer.

    For each prefix overlap, ``r = shared components / components of the longer path``. A short
    shared prefix inside a deep path (``docs`` vs ``docs/guide/api/v2/index.md``, r = 0.2) is a
    broad claim touching a far corner: probably unrelated, skip with probability ``1 - r``. A long
    shared prefix (``src/api/routes`` vs ``src/api/routes/users.py``, r = 0.75) is probably the
    same work: wake with probability ``r``. The closest overlap of the pair decides. With the 0.7
    threshold, r in (0.3, 0.7) abstains — and abstaining wakes."""

    name = "heuristic"

    def classify(self, question: OverlapQuestion) -> Answer:
        if not question.overlaps:
            raise ClassifierError("no prefix overlap to judge")
        ratio = max(
            len(_parts(min(d, h, key=len))) / max(len(_parts(d)), len(_parts(h)), 1)
            for d, h in question.overlaps
        )
        if ratio >= 0.5:
            return Answer(wake=True, probability=ratio)
        return Answer(wake=False, probability=1.0 - ratio)


class HttpClassifier:
    """A model endpoint speaking the JSON contract in the module docstring (stdlib urllib)."""

    name = "http"

    def __init__(
        self, url: str, *, key: SecretStr | None, timeout_s: float, max_answer_bytes: int
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"classifier_url must be an http(s) URL, got {url!r}")
        self.url = url
        self.shown = masked(url)  # what a message names: the URL without its password, if any
        self._password = _password_of(url)
        self._key = key
        self.timeout_s = timeout_s
        self.max_answer_bytes = max_answer_bytes

    def classify(self, question: OverlapQuestion) -> Answer:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self._key is not None:
            headers["Authorization"] = f"Bearer {self._key.get_secret_value()}"
        request = urllib.request.Request(
            self.url, data=orjson.dumps(question.as_json()), headers=headers, method="POST"
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                body = response.read(self.max_answer_bytes + 1)
        except urllib.error.HTTPError as exc:
            raise ClassifierError(f"{self.shown} answered HTTP {exc.code}") from exc
        except TimeoutError as exc:
            raise ClassifierTimeout(f"{self.shown}: no answer within {self.timeout_s:g}s") from exc
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, TimeoutError):
                raise ClassifierTimeout(
                    f"{self.shown}: no answer within {self.timeout_s:g}s"
                ) from exc
            reason = self._scrubbed(str(exc.reason))
            raise ClassifierError(f"{self.shown} unreachable: {reason}") from exc
        except (OSError, http.client.HTTPException) as exc:
            detail = self._scrubbed(str(exc))
            raise ClassifierError(f"{self.shown}: {type(exc).__name__}: {detail}") from exc
        if len(body) > self.max_answer_bytes:
            raise ClassifierError(
                f"{self.shown} answered more than {self.max_answer_bytes} bytes "
                "(classifier_max_answer_bytes)"
            )
        return parse_answer(body, self.shown)

    def _scrubbed(self, text: str) -> str:
        """A library's message about the URL (urllib quotes the host part it failed on, which
        holds the password when the URL has one), without the password."""
        return text.replace(self._password, MASK) if self._password else text


def _password_of(url: str) -> str | None:
    try:
        return urlsplit(url).password
    except ValueError:  # too malformed to parse: masked() hides it all the same
        return None


def parse_answer(body: bytes, source: str) -> Answer:
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise ClassifierError(
            f"{source} answered something that is not JSON: {body[:60]!r}"
        ) from exc
    if not isinstance(data, dict):
        raise ClassifierError(f"{source} answered {data!r}, not an object")
    wake, probability = data.get("wake"), data.get("probability")
    if not isinstance(wake, bool):
        raise ClassifierError(f"{source} answered wake = {wake!r}, expected true or false")
    if (
        isinstance(probability, bool)
        or not isinstance(probability, int | float)
        or not 0.0 <= probability <= 1.0
    ):
        raise ClassifierError(
            f"{source} answered probability = {probability!r}, expected a number in [0, 1]"
        )
    return Answer(wake=wake, probability=float(probability))


class Verdict(StrEnum):
    WAKE = "wake"  # the classifier said wake, confidently
    SKIP = "skip"  # the classifier said skip, confidently: the only outcome that does not wake
    ABSTAIN = "abstain"  # below the threshold
    ERROR = "error"
    TIMEOUT = "timeout"
    CAPPED = "capped"  # the day's calls are used up: not asked

    @property
    def wakes(self) -> bool:
        return self is not Verdict.SKIP


@dataclass(frozen=True, slots=True)
class OverlapJudge:
    classifier: Classifier
    counter: DailyCounter
    calls_per_day: int
    threshold: float
    clock_now: Callable[[], datetime]

    def judge(self, question: OverlapQuestion) -> Verdict:
        day = self.clock_now().strftime("%Y-%m-%d")
        if self.counter.incr(f"classifier-calls:{day}") > self.calls_per_day:
            return Verdict.CAPPED
        try:
            answer = self.classifier.classify(question)
        except ClassifierTimeout as exc:
            log.warning("classifier %s timed out; waking: %s", self.classifier.name, exc)
            return Verdict.TIMEOUT
        except ClassifierError as exc:
            log.warning("classifier %s failed; waking: %s", self.classifier.name, exc)
            return Verdict.ERROR
        if answer.probability < self.threshold:
            return Verdict.ABSTAIN
        return Verdict.WAKE if answer.wake else Verdict.SKIP
