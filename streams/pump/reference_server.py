"""The reference feed (docs/pump.md): an NDJSON file served page by page with its identity, for
the demo and the tests. ``rhumbatron feed-server --file PATH --corpus-id ID --lineage ID``.

``GET /?after=N&limit=K`` answers the file's lines whose sequence is above N, at most
min(K, page size) of them, with ``X-Corpus-Id`` and ``X-Corpus-Lineage``. A request whose
expected pair (``X-Expected-Corpus-Id``, ``X-Expected-Corpus-Lineage``) is not the server's own
is answered 409, with the server's own pair. A line that is not JSON is served where it stands
(after the line before it), so a test can put a malformed line anywhere; the file is read again
when it changes.

What a test needs to drive every case is ``POST /control`` (JSON, any of): ``fail`` (how many
next requests answer ``fail_status``, default 503), ``identity`` (``normal``, ``missing``,
``malformed``, ``corpus-only``), ``lineage`` and ``corpus_id`` (the identity from now on, as a
restart with another lineage), ``delay_s`` (before each answer). ``GET /control`` gives the
state and the number of requests served."""

from __future__ import annotations

import bisect
import itertools
import os
import threading
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import orjson

from streams.envelopes import Event, encode
from streams.pump.identity import (
    CORPUS_ID,
    CORPUS_LINEAGE,
    EXPECTED_CORPUS_ID,
    EXPECTED_CORPUS_LINEAGE,
    Identity,
)
from streams.workload import workload


@dataclass
class FeedState:
    corpus_id: str
    lineage: str
    page_size: int
    fail: int = 0
    fail_status: int = 503
    identity: str = "normal"  # normal | missing | malformed | corpus-only
    delay_s: float = 0.0
    served: int = 0
    seen_expected: list[list[str | None]] = field(default_factory=list)


@dataclass(frozen=True)
class Loaded:
    """A feed file's lines, each with the sequence it is served under."""

    lines: list[tuple[int, bytes]]
    sequences: list[int]
    ordered: bool  # the sequences never fall (a good feed's): pages are found by bisection

    @classmethod
    def of(cls, body: bytes) -> Loaded:
        lines = _sequenced(body)
        sequences = [sequence for sequence, _ in lines]
        ordered = all(a <= b for a, b in itertools.pairwise(sequences))
        return cls(lines, sequences, ordered)

    def page(self, after: int, limit: int) -> list[bytes]:
        """The lines served under a sequence above ``after``, in file order."""
        if self.ordered:
            start = bisect.bisect_right(self.sequences, after)
            return [raw for _, raw in self.lines[start : start + limit]]
        return [raw for sequence, raw in self.lines if sequence > after][:limit]


class FeedFile:
    """The file's lines, read again when it changes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp: tuple[int, int] | None = None
        self._loaded = Loaded([], [], True)
        self._lock = threading.Lock()

    def load(self) -> Loaded:
        with self._lock:
            stat = os.stat(self.path)
            stamp = (stat.st_mtime_ns, stat.st_size)
            if stamp != self._stamp:
                self._loaded = Loaded.of(self.path.read_bytes())
                self._stamp = stamp
            return self._loaded


def _sequenced(body: bytes) -> list[tuple[int, bytes]]:
    out: list[tuple[int, bytes]] = []
    last = 0
    for raw in body.splitlines():
        if not raw.strip():
            continue
        try:
            sequence = orjson.loads(raw).get("sequence")
        except (orjson.JSONDecodeError, AttributeError):
            sequence = None
        if type(sequence) is int:
            last = sequence
        out.append((last, raw))
    return out


class FeedServer:
    def __init__(self, path: Path, identity: Identity, *, page_size: int, port: int = 0) -> None:
        if page_size < 1:
            raise ValueError(f"page size must be at least 1, not {page_size}")
        self.file = FeedFile(path)
        self.file.load()  # a missing or unreadable file fails here, at start
        self.state = FeedState(identity.corpus_id, identity.lineage, page_size)
        self.lock = threading.Lock()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), _handler(self))
        self.httpd.daemon_threads = True

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host!s}:{port}/"

    def serve_forever(self) -> None:
        self.httpd.serve_forever(poll_interval=0.2)

    def start(self) -> FeedServer:
        threading.Thread(target=self.serve_forever, name="feed-server", daemon=True).start()
        return self

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _handler(server: FeedServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _answer(self, status: int, body: bytes, headers: dict[str, str]) -> None:
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            url = urlparse(self.path)
            if url.path == "/control":
                with server.lock:
                    self._answer(200, orjson.dumps(asdict(server.state)), {})
                return
            query = parse_qs(url.query)
            try:
                after = int(query.get("after", ["0"])[0])
                limit = int(query.get("limit", [str(server.state.page_size)])[0])
            except ValueError:
                self._answer(400, b"after and limit must be integers\n", {})
                return
            expected = [
                self.headers.get(EXPECTED_CORPUS_ID),
                self.headers.get(EXPECTED_CORPUS_LINEAGE),
            ]
            with server.lock:
                state = server.state
                state.served += 1
                state.seen_expected.append(expected)
                delay = state.delay_s
                failing = state.fail > 0
                if failing:
                    state.fail -= 1
                ours = {CORPUS_ID: state.corpus_id, CORPUS_LINEAGE: state.lineage}
                if state.identity == "missing":
                    ours = {}
                elif state.identity == "malformed":
                    ours = {CORPUS_ID: state.corpus_id.upper(), CORPUS_LINEAGE: "not-a-uuid"}
                elif state.identity == "corpus-only":
                    ours = {CORPUS_ID: state.corpus_id}
                own = (state.corpus_id, state.lineage)
                size = min(max(limit, 1), state.page_size)
            if delay:
                time.sleep(delay)
            if failing:
                self._answer(server.state.fail_status, b"failing on purpose\n", {})
                return
            if (expected[0] is None) != (expected[1] is None):
                self._answer(400, b"send both expected headers or neither\n", ours)
                return
            if expected[0] is not None and (expected[0], expected[1]) != own:
                self._answer(409, b"expected identity differs from this feed's\n", ours)
                return
            lines = server.file.load().page(after, size)
            body = b"".join(line + b"\n" for line in lines)
            self._answer(200, body, {**ours, "Content-Type": "application/x-ndjson"})

        def do_POST(self) -> None:
            if urlparse(self.path).path != "/control":
                self._answer(404, b"", {})
                return
            length = int(self.headers.get("Content-Length") or 0)
            try:
                change = orjson.loads(self.rfile.read(length) or b"{}")
                with server.lock:
                    for name in (
                        "fail",
                        "fail_status",
                        "identity",
                        "delay_s",
                        "lineage",
                        "corpus_id",
                    ):
                        if name in change:
                            setattr(server.state, name, change[name])
            except (orjson.JSONDecodeError, TypeError, AttributeError) as exc:
                self._answer(400, f"bad control: {exc}\n".encode(), {})
                return
            self._answer(200, orjson.dumps(asdict(server.state)), {})

    return Handler


def feed_file_lines(events: list[Event], *, first: int = 1, step: int = 1) -> list[bytes]:
    """NDJSON lines of a feed over ``events`` (which carry no slot), numbered from ``first`` by
    ``step`` (a step over 1 leaves gaps, which a feed may)."""
    return [
        b'{"sequence":%d,"event":%s}' % (first + n * step, encode(event, max_bytes=1 << 30))
        for n, event in enumerate(events)
    ]


def workload_feed(
    run: str, projects: int, count: int, *, first: int = 1, step: int = 1
) -> list[bytes]:
    """A feed of the synthetic workload (streams.workload): ``count`` events over ``projects``."""
    base = datetime(2026, 1, 1, tzinfo=UTC)
    events = [
        draft.to_event(
            tenant_id="tenant-feed", timestamp=base + timedelta(milliseconds=n), slot=None
        )
        for n, draft in enumerate(workload(run, projects, count))
    ]
    return feed_file_lines(events, first=first, step=step)
