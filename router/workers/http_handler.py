"""A service in any language as a command handler: the worker POSTs each command to it, signed as
the Standard Webhooks specification says, and reads the outcome from the reply's status
(docs/handlers.md, "Any language: the HTTP contract").

| reply | outcome |
|---|---|
| 2xx, empty body | done |
| 2xx, ``{"commands": [...], "more_work": bool}`` | done with follow-ups; more work asked |
| 2xx, any other body | a failed attempt (``malformed reply``) |
| 408, 429, 503 | Retry, after ``Retry-After`` (seconds or an HTTP date) |
| 401, 403 | Retry, counted as an auth failure (a rotation gone wrong must not dead-letter) |
| 409 and other 4xx | Fail, with the reply's first 1,000 bytes |
| 5xx, timeout, refused, TLS failure | a failed attempt |
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import ssl
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any, ClassVar

import httpx
from opentelemetry import metrics, propagate
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel

from router.workers.model import Context, QueueHandler
from streams.envelopes import Command, build
from streams.errors import EnvelopeError, Fail, HandlerHTTPError, MoreWork, Retry

log = logging.getLogger("rhumbatron.worker")

RETRY_STATUSES = frozenset({408, 429, 503})
AUTH_STATUSES = frozenset({401, 403})
REASON_BYTES = 1000  # of a refusal's body, in the Fail reason and the dead letter

_auth_failures = metrics.get_meter("rhumbatron.workers").create_counter(
    "rhumbatron_handler_auth_failures",
    unit="",
    description="HTTP handler replies 401 or 403: the receiver refused the worker's signature",
)


def sign(keys: Sequence[bytes], message_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` header: ``v1,<base64 HMAC-SHA256>`` of ``id.timestamp.body``
    with each key, space-separated."""
    signed = f"{message_id}.{timestamp}.".encode() + body
    return " ".join(
        "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
        for key in keys
    )


def retry_after(value: str | None, now: datetime) -> float | None:
    """Seconds to wait from a ``Retry-After`` header: whole seconds, or an HTTP date."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - now).total_seconds())


class FollowUp(BaseModel):
    """A follow-up command in a handler's reply: sent as ``ctx.send`` sends one."""

    model_config = ConfigDict(extra="forbid", alias_generator=to_camel, populate_by_name=False)

    command_type: str
    project_id: str
    change_id: str | None = None
    task_id: str | None = None
    deadline: datetime | None = None
    payload: dict[str, Any] = Field(default_factory=dict)
    queue: str | None = Field(None, description="default: the queue of its type in the catalog")


class HandlerReply(BaseModel):
    """The body a receiver may answer a 2xx with (or nothing at all)."""

    model_config = ConfigDict(extra="forbid", title="Rhumbatron HTTP handler reply")

    commands: list[FollowUp] = Field(default_factory=list)
    more_work: bool = False


class HttpHandler(QueueHandler):
    """POSTs each command to ``url`` (see the module docstring for the contract)."""

    name: ClassVar[str] = "http"

    def __init__(
        self,
        url: str,
        keys: Sequence[bytes],
        *,
        timeout_s: float,
        max_response_bytes: int,
        max_connections: int = 64,
        ca_file: str | None = None,
        cert_file: str | None = None,
        key_file: str | None = None,
    ) -> None:
        self.url = url
        self.keys = list(keys)
        self.max_response_bytes = max_response_bytes
        # TLS: the CA bundle given (else the system's), and a client certificate for mutual TLS.
        tls = (
            ssl.create_default_context(cafile=ca_file) if ca_file else ssl.create_default_context()
        )
        if cert_file:
            tls.load_cert_chain(cert_file, key_file)
        self.client = httpx.Client(
            timeout=timeout_s,
            verify=tls,
            limits=httpx.Limits(
                max_connections=max_connections, max_keepalive_connections=max_connections
            ),
            follow_redirects=False,
        )

    def measure(self, queue: str) -> None:
        """Serve ``queue``'s auth failures from 0 on, once the process's metrics have started:
        a series an alert judges before the first refusal."""
        _auth_failures.add(0, {"queue": queue})

    def handle(self, command: Command, ctx: Context) -> str | None:
        body = ctx.record.value or b""
        # A further delivery asked for with more work is a new message to the receiver (its
        # replay protection must not drop it); a retry is the same message again.
        message_id = (
            f"{command.command_id}.d{ctx.attempt}" if ctx.redelivered else command.command_id
        )
        timestamp = int(time.time())
        headers = {
            "content-type": "application/json",
            "webhook-id": message_id,
            "webhook-timestamp": str(timestamp),
            "webhook-signature": sign(self.keys, message_id, timestamp, body),
            "rh-attempt": str(ctx.attempt),
            "rh-max-attempts": str(ctx.max_attempts),
            "rh-queue": ctx.queue,
        }
        if command.deadline is not None:
            headers["rh-deadline"] = command.deadline.isoformat()
        propagate.inject(headers)  # traceparent: the worker's span for this command
        status, reply, after = self._post(body, headers)
        if 200 <= status < 300:
            self._outcome(reply, ctx)
            return None
        text = reply[:REASON_BYTES].decode("utf-8", "replace").strip()
        said = f"HTTP {status} from {self.url}" + (f": {text}" if text else "")
        if status in AUTH_STATUSES:
            _auth_failures.add(1, {"queue": ctx.queue})
            log.warning(
                "%s: %s refused the signature of %s (HTTP %d): retried; check "
                "RHUMBATRON_HTTP_HANDLER_SECRETS against the receiver's",
                ctx.queue,
                self.url,
                command.command_id,
                status,
            )
            raise Retry(reason=said)
        if status in RETRY_STATUSES:
            raise Retry(delay_s=retry_after(after, datetime.now(UTC)), reason=said)
        if 400 <= status < 500:
            raise Fail(said)
        raise HandlerHTTPError(said)

    def _post(self, body: bytes, headers: dict[str, str]) -> tuple[int, bytes, str | None]:
        try:
            with self.client.stream("POST", self.url, content=body, headers=headers) as response:
                reply = bytearray()
                for chunk in response.iter_bytes():
                    reply += chunk
                    if len(reply) > self.max_response_bytes:
                        if 200 <= response.status_code < 300:
                            raise HandlerHTTPError(
                                f"malformed reply from {self.url}: body over "
                                f"http_handler_max_response_bytes={self.max_response_bytes}"
                            )
                        break  # a refusal's reason is cut anyway
                return response.status_code, bytes(reply), response.headers.get("retry-after")
        except httpx.TimeoutException as exc:
            raise HandlerHTTPError(f"{self.url} did not answer in time: {exc!r}") from None
        except httpx.HTTPError as exc:  # refused, reset, TLS, a bad redirect …
            raise HandlerHTTPError(f"{self.url}: {type(exc).__name__}: {exc}") from None

    def _outcome(self, reply: bytes, ctx: Context) -> None:
        if not reply.strip():
            return
        try:
            answer = HandlerReply.model_validate_json(reply)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(part) for part in first["loc"]) or "the body"
            raise HandlerHTTPError(
                f"malformed reply from {self.url}: a 2xx body must be empty or "
                f'{{"commands": [...], "more_work": true|false}}: {where}: {first["msg"]} '
                f"(got {reply[:200]!r})"
            ) from None
        for n, item in enumerate(answer.commands):
            try:
                command = build(
                    Command,
                    command_id="cmd_followup",  # replaced by ctx.send with a derived one
                    command_type=item.command_type,
                    project_id=item.project_id,
                    change_id=item.change_id,
                    task_id=item.task_id,
                    created_at=ctx.now,
                    deadline=item.deadline,
                    payload=item.payload,
                )
            except EnvelopeError as exc:
                raise HandlerHTTPError(
                    f"malformed reply from {self.url}: commands.{n}: {exc}"
                ) from None
            ctx.send(command, item.queue)
        if answer.more_work:
            raise MoreWork()

    def close(self) -> None:
        self.client.close()


SCHEMA_BASE = "urn:rhumbatron:schema:"  # an identifier, never fetched


def contract_schemas() -> dict[str, dict[str, Any]]:
    """The HTTP contract's JSON Schemas (2020-12), by file name under ``schemas/``: the request
    body (the command envelope as the worker POSTs it) and the reply a receiver may send."""
    request = Command.model_json_schema(by_alias=True, mode="serialization")
    request.update(title="Rhumbatron command (HTTP handler request body)")
    reply = HandlerReply.model_json_schema(by_alias=True)
    out = {}
    for name, schema in (
        ("handler-request.schema.json", request),
        ("handler-reply.schema.json", reply),
    ):
        out[name] = {
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "$id": SCHEMA_BASE + name,
            **schema,
        }
    return out


if __name__ == "__main__":  # python -m router.workers.http_handler DIR: (re)writes the schemas
    import json
    import sys
    from pathlib import Path

    folder = Path(sys.argv[1] if len(sys.argv) > 1 else "schemas")
    folder.mkdir(exist_ok=True)
    for file_name, schema in contract_schemas().items():
        (folder / file_name).write_text(json.dumps(schema, indent=2, sort_keys=True) + "\n")
        print(folder / file_name)
