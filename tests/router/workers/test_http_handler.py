"""The HTTP handler contract, against a real HTTP server in a thread and the worker on the
in-memory log: the signature (and its published test vector), each status class, Retry-After,
a rotated secret, replies that are garbage, huge or nothing, follow-ups and more work."""

from __future__ import annotations

import base64
import ssl
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from pathlib import Path

import orjson
import pytest
import trustme

from router.settings import Settings
from router.wiring.workers import http_handler
from router.workers.http_handler import HttpHandler, retry_after, sign
from streams.envelopes import decode_command
from streams.errors import ConfigurationError
from streams.headers import ERROR, ERROR_TYPE, header_dict
from streams.topology import queue_name
from tests.support.environment import ROOT
from tests.support.receiver import Reply, receiving
from tests.support.worker_harness import ENV, MAX, World, policy

KEY = bytes(range(32))
OTHER = bytes(range(1, 33))
# The test vector docs/handlers.md publishes.
VECTOR_SECRET = "whsec_AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8="
VECTOR_BODY = b'{"commandId":"cmd_example","commandType":"index.build"}'
VECTOR_SIGNATURE = "v1,ax+Hi3H0vw/jUnyN/M/sXodLfDHdZlCXXw0sWLw/MyA="


def _world(**overrides: object) -> World:
    values: dict[str, object] = {
        "retry_tiers_s": (60, 600, 3600),
        "retries": 2,
        "retry_delay_s": 1.0,
    }
    values.update(overrides)
    world = World(policy(**values))  # type: ignore[arg-type]
    world.log.create(queue_name("integration", ENV), 1)
    return world


def _handler(url: str, keys: list[bytes], **kw: object) -> HttpHandler:
    values: dict[str, object] = {"timeout_s": 2.0, "max_response_bytes": 4096}
    values.update(kw)
    return HttpHandler(url, keys, **values)  # type: ignore[arg-type]


def _by_mode(replies: dict[str, Callable[[int], Reply]]) -> Callable[..., Reply]:
    """Answers by the command's payload ``mode`` and the attempt header."""

    def script(body: dict[str, object], headers: dict[str, str]) -> Reply:
        payload = body.get("payload")
        mode = payload.get("mode", "ok") if isinstance(payload, dict) else "ok"
        return replies[str(mode)](int(headers["rh-attempt"]))

    return script


def test_the_signature_matches_the_published_test_vector() -> None:
    key = base64.b64decode(VECTOR_SECRET.removeprefix("whsec_"))
    assert sign([key], "cmd_example", 1767225600, VECTOR_BODY) == VECTOR_SIGNATURE
    text = (ROOT / "docs" / "handlers.md").read_text()
    for part in (VECTOR_SECRET, VECTOR_BODY.decode(), VECTOR_SIGNATURE, "1767225600"):
        assert part in text, part


def test_retry_after_reads_seconds_and_http_dates() -> None:
    now = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
    assert retry_after("120", now) == 120.0
    assert retry_after(format_datetime(now + timedelta(seconds=90), usegmt=True), now) == 90.0
    assert retry_after(format_datetime(now - timedelta(seconds=90), usegmt=True), now) == 0.0
    assert retry_after("soon", now) is None
    assert retry_after(None, now) is None


def test_each_status_class_settles_as_the_contract_says() -> None:
    world = _world()
    replies: dict[str, Callable[[int], Reply]] = {
        "ok": lambda a: (204, {}, b""),
        "conflict": lambda a: (409, {}, b"already a candidate for chg1" + b"x" * 3000),
        "later": lambda a: (503, {"Retry-After": "120"}, b"") if a == 1 else (200, {}, b""),
        "busy": lambda a: (429, {}, b"") if a == 1 else (200, {}, b""),
        "broken": lambda a: (500, {}, b"stack trace") if a == 1 else (200, {}, b""),
        "garbage": lambda a: (200, {}, b"<html>ok</html>") if a == 1 else (200, {}, b""),
        "huge": lambda a: (200, {}, b"[" + b"1," * 5000 + b"1]") if a == 1 else (200, {}, b""),
        "gone": lambda a: (404, {}, b"no such project"),
    }
    with receiving([KEY], _by_mode(replies)) as receiver:
        worker = world.worker(_handler(receiver.url, [KEY]))
        modes = list(replies)
        world.send(*(world.command(f"cmd_{m}", mode=m) for m in modes))
        world.run_for(worker, 700)
    assert all(s.signed for s in receiver.seen)
    attempts = {
        m: [s.headers["rh-attempt"] for s in receiver.seen if f'"cmd_{m}"' in s.body.decode()]
        for m in modes
    }
    assert attempts == {
        "ok": ["1"],
        "conflict": ["1"],
        "later": ["1", "2"],
        "busy": ["1", "2"],
        "broken": ["1", "2"],
        "garbage": ["1", "2"],
        "huge": ["1", "2"],
        "gone": ["1"],
    }
    letters = {
        decode_command(r.value, max_bytes=MAX).command_id: header_dict(r.headers)
        for r in world.dead_letters()
    }
    assert sorted(letters) == ["cmd_conflict", "cmd_gone"]
    reason = letters["cmd_conflict"][ERROR] or b""
    assert reason.startswith(b"HTTP 409 from") and b"already a candidate for chg1" in reason
    assert len(reason) <= 1000 + 200 and letters["cmd_conflict"][ERROR_TYPE] == b"Fail"
    retries = {
        decode_command(r.value, max_bytes=MAX).command_id: (r.topic, header_dict(r.headers))
        for topic in world.policy.retry_topics
        for r in world.log.all(topic)
    }
    # Retry-After: 120 waits on the 600 s tier; 429 without one, the queue's own delay.
    assert retries["cmd_later"][0].endswith("-retry-600s-unit")
    assert retries["cmd_busy"][0] == world.policy.retry_topic
    assert (retries["cmd_garbage"][1][ERROR] or b"").startswith(b"malformed reply")
    assert b"http_handler_max_response_bytes" in (retries["cmd_huge"][1][ERROR] or b"")
    assert retries["cmd_broken"][1][ERROR_TYPE] == b"HandlerHTTPError"


def test_a_refused_signature_is_retried_never_dead_lettered() -> None:
    world = _world(retries=1)
    with receiving([OTHER], _by_mode({"ok": lambda a: (200, {}, b"")})) as receiver:
        worker = world.worker(_handler(receiver.url, [KEY]))
        world.send(world.command("cmd_a"))
        world.run_for(worker, 5)
        assert [s.signed for s in receiver.seen] == [False, False]
        # The last attempt failed on auth too: a dead letter names it, it was never a Fail.
        (letter,) = world.dead_letters()
        assert header_dict(letter.headers)[ERROR_TYPE] == b"Retry"
        # Rotation: the worker signs with both the old and the new secret.
        receiver.seen.clear()
        worker2 = world.worker(_handler(receiver.url, [KEY, OTHER]))
        world.send(world.command("cmd_b"))
        world.run_for(worker2, 3)
    assert [s.signed for s in receiver.seen] == [True]
    assert len(receiver.seen[0].headers["webhook-signature"].split()) == 2


def test_follow_ups_and_more_work_in_a_reply() -> None:
    world = _world()
    follow = {
        "commands": [
            {"commandType": "change.dispatch", "projectId": "p1", "payload": {"n": 1}},
            {"commandType": "index.build", "projectId": "p1", "queue": "integration"},
        ]
    }
    replies: dict[str, Callable[[int], Reply]] = {
        "follow": lambda a: (200, {}, orjson.dumps(follow)),
        "more": lambda a: (200, {}, b'{"more_work": true}') if a < 3 else (200, {}, b""),
        "bad": lambda a: (200, {}, b'{"commands": [{"projectId": "p1"}]}'),
    }
    with receiving([KEY], _by_mode(replies)) as receiver:
        worker = world.worker(_handler(receiver.url, [KEY]))
        world.send(world.command("cmd_f", mode="follow"), world.command("cmd_m", mode="more"))
        world.send(world.command("cmd_bad", mode="bad"))
        world.run_for(worker, 10)
    sent = [
        decode_command(r.value, max_bytes=MAX)
        for r in world.log.all(queue_name("integration", ENV))
    ]
    assert [(c.command_id, c.command_type) for c in sent] == [
        ("cmd_f.a1.f0", "change.dispatch"),
        ("cmd_f.a1.f1", "index.build"),
    ]
    ids = [s.headers["webhook-id"] for s in receiver.seen if b'"cmd_m"' in s.body]
    assert ids == ["cmd_m", "cmd_m.d2", "cmd_m.d3"]  # each further delivery a new message
    bad = [r for t in world.policy.retry_topics for r in world.log.all(t)]
    assert any(b"commandType" in (header_dict(r.headers)[ERROR] or b"") for r in bad)


def test_a_receiver_that_is_not_there_is_a_failed_attempt() -> None:
    world = _world(retries=0)
    worker = world.worker(_handler("http://127.0.0.1:9/nothing", [KEY], timeout_s=1.0))
    world.send(world.command("cmd_a"))
    world.run_for(worker, 2)
    (letter,) = world.dead_letters()
    assert header_dict(letter.headers)[ERROR_TYPE] == b"HandlerHTTPError"


def test_the_http_handler_is_refused_without_a_secret_or_with_a_bad_one() -> None:
    with pytest.raises(ConfigurationError, match="no signing secret"):
        http_handler(Settings(), "https://svc.example/commands")
    with pytest.raises(ConfigurationError, match="must be an http:// or https:// URL"):
        http_handler(Settings(http_handler_secrets=VECTOR_SECRET), "ftp://svc")
    with pytest.raises(ConfigurationError, match="cannot be used: .*No such file"):
        http_handler(
            Settings(http_handler_secrets=VECTOR_SECRET, http_handler_ca_file="/nonexistent.pem"),
            "https://svc.example/commands",
        )
    with pytest.raises(ValueError, match="secret 2 is not whsec_"):
        Settings(http_handler_secrets=f"{VECTOR_SECRET} whsec_short")


def test_the_published_schemas_are_the_models() -> None:
    import json

    from router.workers.http_handler import contract_schemas

    for name, schema in contract_schemas().items():
        path = ROOT / "schemas" / name
        assert json.loads(path.read_text()) == schema, (
            f"{path} is not what the models say: run .venv/bin/python -m "
            "router.workers.http_handler schemas"
        )


def test_tls_with_the_settings_ca_and_a_client_certificate(tmp_path: Path) -> None:
    ca = trustme.CA()
    server = ca.issue_cert("localhost")
    client = ca.issue_cert("rhumbatron-worker")
    ca_file, cert_file, key_file = tmp_path / "ca.pem", tmp_path / "c.pem", tmp_path / "k.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    client.cert_chain_pems[0].write_to_path(str(cert_file))
    client.private_key_pem.write_to_path(str(key_file))
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.configure_cert(context)
    ca.configure_trust(context)
    context.verify_mode = ssl.CERT_REQUIRED  # mutual TLS: the worker must show its certificate
    with receiving([KEY], _by_mode({"ok": _done}), tls=context) as receiver:
        assert receiver.url.startswith("https://")
        trusted = World(policy(retries=0))
        worker = trusted.worker(
            _handler(
                receiver.url,
                [KEY],
                ca_file=str(ca_file),
                cert_file=str(cert_file),
                key_file=str(key_file),
            )
        )
        trusted.send(trusted.command("cmd_tls"))
        trusted.run_for(worker, 2)
        assert worker.stats.outcomes["ok"] == 1
        # Without the CA (the system's do not know it), the TLS failure is a failed attempt.
        strange = World(policy(retries=0))
        refused = strange.worker(_handler(receiver.url, [KEY]))
        strange.send(strange.command("cmd_tls"))
        strange.run_for(refused, 2)
    (letter,) = strange.dead_letters()
    assert b"CERTIFICATE_VERIFY_FAILED" in (header_dict(letter.headers)[ERROR] or b"")
    assert len(receiver.seen) == 1


def _done(attempt: int) -> Reply:
    return 204, {}, b""
