"""The classifier around the prefix-overlap rule: the daily cap shared across processors, the
abstention threshold, and the HTTP client against a real local server (answers, errors,
timeouts). Abstention, error, timeout and the cap all mean wake."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import orjson
import pytest
from pydantic import SecretStr

from consumers.subscriptions.causal_router.budget import MemoryDailyCounter
from consumers.subscriptions.causal_router.classifier import (
    Answer,
    HeuristicClassifier,
    HttpClassifier,
    OverlapQuestion,
)
from streams.clock import ManualClock
from streams.envelopes import Command
from streams.errors import ClassifierError
from tests.support.causal_router import (
    START,
    History,
    ScriptedClassifier,
    drive,
    make_router,
    open_test_outbox,
)


def _prefix_overlaps(h: History, n: int, *, tag: str = "") -> None:
    """agent-b holds src/api/routes.py; agent-a declares src/api ``n`` times (prefix only)."""
    h.add("task.created", task="ta", resources=["src/own.py"])
    h.add("task.started", task="ta", agentId="agent-a")
    h.add("task.created", task="tb", resources=["src/api/routes.py"])
    h.add("task.started", task="tb", agentId="agent-b")
    for i in range(n):
        h.add(
            "intent.declared", task="ta", agentId="agent-a", resources=["src/api"], key=f"{tag}{i}"
        )


def _wakes(commands: list[Command]) -> list[str]:
    return [str(c.payload.get("classifier")) for c in commands if c.command_type == "agent.wake"]


def test_the_daily_cap_is_shared_by_two_processors_and_past_it_the_agent_wakes(
    tmp_path: Path,
) -> None:
    shared = MemoryDailyCounter()  # two processes sharing the Redis counter
    clock = ManualClock(START)
    skip = Answer(wake=False, probability=0.95)
    first, second = ScriptedClassifier(skip), ScriptedClassifier(skip)
    routers = [
        make_router(
            open_test_outbox(tmp_path / f"o{n}.sqlite"),
            classifier=c,
            counter=shared,
            calls_per_day=3,
            clock=clock,
        )
        for n, c in enumerate((first, second))
    ]
    h1, h2 = History(project="proj-1"), History(project="proj-2")
    _prefix_overlaps(h1, 2)
    _prefix_overlaps(h2, 3)
    assert _wakes(drive(routers[0], h1.events)) == []  # 2 calls, both confident skips
    # The second processor gets 1 call left of the day's 3; then the cap wakes without asking.
    assert _wakes(drive(routers[1], h2.events)) == ["capped", "capped"]
    assert (len(first.questions), len(second.questions)) == (2, 1)
    assert routers[1].stats.classifier == {"skip": 1, "capped": 2}
    # A new day, a new allowance.
    clock.advance(86_400)
    h3 = History(project="proj-3")
    _prefix_overlaps(h3, 1)
    assert _wakes(drive(routers[1], h3.events)) == []
    assert len(second.questions) == 2


@pytest.mark.parametrize(
    ("answer", "wakes_as"),
    [
        (Answer(wake=False, probability=0.69), ["abstain"]),
        (Answer(wake=False, probability=0.7), []),
        (Answer(wake=True, probability=0.69), ["abstain"]),
        (Answer(wake=True, probability=0.99), ["wake"]),
    ],
)
def test_below_the_threshold_the_classifier_abstains_and_the_agent_wakes(
    tmp_path: Path, answer: Answer, wakes_as: list[str]
) -> None:
    router = make_router(
        open_test_outbox(tmp_path / "o.sqlite"), classifier=ScriptedClassifier(answer)
    )
    h = History()
    _prefix_overlaps(h, 1)
    assert _wakes(drive(router, h.events)) == wakes_as


def _question(declared: str, held: str) -> OverlapQuestion:
    return OverlapQuestion(
        project_id="p",
        change_id="c",
        event_id="evt_" + "0" * 32,
        event_type="intent.declared",
        declaring_agent="a",
        declared=(declared,),
        active_agent="b",
        held=(held,),
        overlaps=((declared, held),),
    )


@pytest.mark.parametrize(
    ("declared", "held", "answer"),
    [
        ("docs", "docs/guide/api/v2/index.md", Answer(False, 0.8)),  # 1/5
        ("src/api", "src/api/models/v1/schemas/x.py", Answer(False, 2 / 3)),  # 2/6
        ("src/api", "src/api/routes.py", Answer(True, 2 / 3)),  # 2/3
        ("src/api/routes/users.py", "src/api/routes", Answer(True, 0.75)),  # either direction
        ("src", "src/a.py", Answer(True, 0.5)),
    ],
)
def test_the_heuristic_is_deterministic_on_the_shared_prefix(
    declared: str, held: str, answer: Answer
) -> None:
    got = {HeuristicClassifier().classify(_question(declared, held)) for _ in range(3)}
    assert len(got) == 1
    (only,) = got
    assert only.wake == answer.wake
    assert only.probability == pytest.approx(answer.probability)


# -- the HTTP client against a real server ----------------------------------------------------
@dataclass
class Script:
    status: int = 200
    body: bytes = b'{"wake": false, "probability": 0.9}'
    hold: threading.Event | None = None  # answer only once this is set
    requests: list[dict[str, Any]] = field(default_factory=list)


@pytest.fixture
def model() -> Iterator[tuple[str, Script]]:
    script = Script()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers["Content-Length"])
            script.requests.append(
                {
                    "path": self.path,
                    "headers": dict(self.headers),
                    "body": orjson.loads(self.rfile.read(length)),
                }
            )
            if script.hold is not None:
                script.hold.wait(30)
            self.send_response(script.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(script.body)))
            self.end_headers()
            self.wfile.write(script.body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1/overlap", script
    finally:
        if script.hold is not None:
            script.hold.set()
        server.shutdown()
        server.server_close()


def _http(url: str, timeout_s: float = 5.0) -> HttpClassifier:
    return HttpClassifier(url, key=SecretStr("s3cret"), timeout_s=timeout_s, max_answer_bytes=1024)


def test_the_http_classifier_speaks_the_documented_contract(
    model: tuple[str, Script], tmp_path: Path
) -> None:
    url, script = model
    router = make_router(open_test_outbox(tmp_path / "o.sqlite"), classifier=_http(url))
    h = History()
    _prefix_overlaps(h, 1)
    assert _wakes(drive(router, h.events)) == []  # a confident skip
    (request,) = script.requests
    assert request["path"] == "/v1/overlap"
    assert request["headers"]["Authorization"] == "Bearer s3cret"
    assert request["headers"]["Content-Type"] == "application/json"
    assert request["body"] == {
        "kind": "resource-overlap",
        "projectId": "proj-1",
        "changeId": "chg-1",
        "eventId": h.events[-1].event_id,
        "eventType": "intent.declared",
        "declaring": {"agentId": "agent-a", "resources": ["src/api"]},
        "active": {"agentId": "agent-b", "resources": ["src/api/routes.py"]},
        "overlaps": [{"declared": "src/api", "held": "src/api/routes.py"}],
    }


@pytest.mark.parametrize(
    ("status", "body", "outcome"),
    [
        (200, b'{"wake": true, "probability": 0.91}', "wake"),
        (200, b'{"wake": false, "probability": 0.5}', "abstain"),
        (500, b'{"error": "overloaded"}', "error"),
        (401, b"{}", "error"),
        (200, b"<html>not json</html>", "error"),
        (200, b'{"wake": "yes", "probability": 0.9}', "error"),
        (200, b'{"wake": false, "probability": 1.5}', "error"),
        (200, b'{"wake": false}', "error"),
        (200, b'{"wake": false, "probability": 0.9, "pad": "' + b"x" * 2000 + b'"}', "error"),
    ],
)
def test_a_bad_or_unsure_http_answer_wakes_the_agent(
    model: tuple[str, Script], tmp_path: Path, status: int, body: bytes, outcome: str
) -> None:
    url, script = model
    script.status, script.body = status, body
    router = make_router(open_test_outbox(tmp_path / "o.sqlite"), classifier=_http(url))
    h = History()
    _prefix_overlaps(h, 1)
    assert _wakes(drive(router, h.events)) == [outcome]
    assert router.stats.classifier == {outcome: 1}


def test_no_answer_within_the_timeout_wakes_the_agent(
    model: tuple[str, Script], tmp_path: Path
) -> None:
    url, script = model
    script.hold = threading.Event()  # the server answers only after the test is over
    router = make_router(
        open_test_outbox(tmp_path / "o.sqlite"), classifier=_http(url, timeout_s=0.3)
    )
    h = History()
    _prefix_overlaps(h, 1)
    assert _wakes(drive(router, h.events)) == ["timeout"]
    assert len(script.requests) == 1


def test_an_unreachable_endpoint_wakes_the_agent(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    router = make_router(
        open_test_outbox(tmp_path / "o.sqlite"), classifier=_http(f"http://127.0.0.1:{port}/")
    )
    h = History()
    _prefix_overlaps(h, 1)
    assert _wakes(drive(router, h.events)) == ["error"]


def test_the_http_classifier_refuses_a_url_that_is_not_http() -> None:
    with pytest.raises(ValueError, match="classifier_url must be an http"):
        HttpClassifier("ftp://x", key=None, timeout_s=1, max_answer_bytes=100)


def test_the_heuristic_has_nothing_to_say_without_a_prefix_overlap() -> None:
    with pytest.raises(ClassifierError, match="no prefix overlap"):
        HeuristicClassifier().classify(
            OverlapQuestion(
                project_id="p",
                change_id=None,
                event_id="evt_" + "0" * 32,
                event_type="intent.declared",
                declaring_agent="a",
                declared=("a",),
                active_agent="b",
                held=("b",),
                overlaps=(),
            )
        )
