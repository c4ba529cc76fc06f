"""The feed over HTTP: ``GET <feed>?after=<sequence>&limit=<page size>`` (httpx), the expected
pair sent whenever there is one. A refused connection, a timeout or a broken transfer is
FeedUnavailable (worth another try); any answer, whatever its status, is handed back whole for
the pump to check its identity."""

from __future__ import annotations

import httpx

from streams.errors import FeedUnavailable, PumpError
from streams.pump.identity import Identity
from streams.pump.pump import FeedResponse


class HttpFeed:
    def __init__(self, url: str, *, timeout_s: float, max_page_bytes: int) -> None:
        self.url = url
        self.max_page_bytes = max_page_bytes
        self.client = httpx.Client(timeout=timeout_s, follow_redirects=False)

    def fetch(self, after: int, expected: Identity | None, limit: int) -> FeedResponse:
        headers = expected.expected_headers() if expected is not None else {}
        params = {"after": str(after), "limit": str(limit)}
        try:
            with self.client.stream("GET", self.url, params=params, headers=headers) as response:
                body = bytearray()
                for chunk in response.iter_bytes():
                    body += chunk
                    if len(body) > self.max_page_bytes:
                        raise PumpError(
                            f"the feed's page after={after} is over {self.max_page_bytes} bytes "
                            "(pump_page_max_bytes): ask for smaller pages (pump_page_size)"
                        )
                return FeedResponse(response.status_code, dict(response.headers), bytes(body))
        except httpx.HTTPError as exc:
            raise FeedUnavailable(
                f"the feed at {self.url} could not be read: {type(exc).__name__}: {exc}"
            ) from exc

    def close(self) -> None:
        self.client.close()
