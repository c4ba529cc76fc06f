"""A receiver of the HTTP handler contract in a thread, for unit tests: it checks the Standard
Webhooks signature with its own keys and answers each request with what the test scripted for
that command id (status, headers, body), remembering every request."""

from __future__ import annotations

import base64
import hashlib
import hmac
import ssl
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import orjson

Reply = tuple[int, dict[str, str], bytes]


@dataclass
class Seen:
    headers: dict[str, str]
    body: bytes
    signed: bool  # a signature in the header matched one of the receiver's keys


@dataclass
class Receiver:
    url: str
    keys: list[bytes]
    script: Callable[[dict[str, object], dict[str, str]], Reply]
    seen: list[Seen] = field(default_factory=list)


def verifies(keys: list[bytes], headers: dict[str, str], body: bytes) -> bool:
    signed = f"{headers['webhook-id']}.{headers['webhook-timestamp']}.".encode() + body
    for key in keys:
        want = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
        for given in headers.get("webhook-signature", "").split():
            version, _, value = given.partition(",")
            if version == "v1" and hmac.compare_digest(value, want):
                return True
    return False


@contextmanager
def receiving(
    keys: list[bytes],
    script: Callable[[dict[str, object], dict[str, str]], Reply],
    *,
    tls: ssl.SSLContext | None = None,
) -> Iterator[Receiver]:
    """The receiver on a free port; with ``tls``, over HTTPS with that server context."""
    receiver: Receiver

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
            headers = {k.lower(): v for k, v in self.headers.items()}
            signed = verifies(receiver.keys, headers, body)
            receiver.seen.append(Seen(headers, body, signed))
            if not signed:
                status, extra, reply = 401, dict[str, str](), b"bad signature"
            else:
                status, extra, reply = receiver.script(orjson.loads(body), headers)
            self.send_response(status)
            for k, v in extra.items():
                self.send_header(k, v)
            self.send_header("content-length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    scheme = "http"
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
        scheme = "https"
    url = f"{scheme}://localhost:{server.server_address[1]}/commands"
    receiver = Receiver(url, keys, script)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
