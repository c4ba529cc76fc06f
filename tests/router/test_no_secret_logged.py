"""No secret is ever logged or printed: every secret setting holds a marker of its own, a full run
goes by at INFO (``-v``) in both log formats — the outbox written and published, every
subscription consumed, a worker, ``config show``, the operator server asked over HTTP, and the
errors a wrong credential gives — and no marker shows in anything any process wrote.

The secret settings are found by introspection (every field of :class:`Settings` whose type holds
a ``SecretStr``), so a new one is covered without a word here; one the run cannot set by itself
(a map) fails the test until it is taught how. Where a marker would stop the run it is made to
work, or is exercised where it fails:

- Redis: a Redis ACL user of the test's own, with the marker as its password, is the run's login
  (``redis_password`` wins over the password of ``redis_url``, which holds a marker too);
- operator tokens: the server is asked with the read token and a named operator's, and once with
  a wrong token;
- Kafka's login secrets (SASL password, client key password, OAuth client secret) apply to the
  secured listener only (the settings refuse them on PLAINTEXT): the run uses the plain listener,
  and each is then used in a login that fails (a wrong SCRAM password on the secured listener,
  an OAuth token endpoint that does not answer), whose error is printed;
- the PostgreSQL password of an outbox URL: no role of the test server may be made, so a
  ``postgresql://`` outbox with the marker as password is written to (refused, printed) and
  reported by the operator server (its failure shown);
- the classifier key and the password in its URL: the causal router's classifier is a port that
  does not answer, so every call fails and is logged;
- the S3 keys: the audit archive is local; an ``archive count`` against an S3 store that does not
  answer fails, printed;
- librdkafka's pass-through properties (all kept as secrets): ``client.rack``, which any value
  suits.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import re
import secrets
import signal
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import quote, urlsplit

import httpx
import orjson
import pytest
import redis
from pydantic import SecretStr

from consumers.subscriptions.causal_router.classifier import (
    HttpClassifier,
    OverlapJudge,
    OverlapQuestion,
    Verdict,
)
from router.settings import Settings
from tests.support.environment import ROOT, TEST_REDIS, cleanup_environment, make_settings
from tests.support.runtime_processes import runtime_settings
from tests.support.secured import SECURED_DIR, read_client_env

MARK = "Mq7sEcReT"  # every marker starts so: one search finds any of them
SUBSCRIPTIONS = (
    "ledger",
    "project-view-projector",
    "causal-router",
    "audit-archiver",
    "analytics-projector",
)
# Set on the secured listener only: the settings refuse them on the plain one.
KAFKA_LOGIN = ("kafka_sasl_password", "kafka_ssl_key_password", "kafka_oauth_client_secret")
# How a map of secrets gets one: its key.
MAP_KEYS = {"kafka": "CLIENT__RACK", "operator_tokens": "alice"}
CLOSED = "127.0.0.1:1"  # nothing listens on port 1: a connection is refused at once


def _marker(name: str) -> str:
    return f"{MARK}-{name.replace('_', '-')}-{secrets.token_hex(12)}"  # 32+ characters


def secret_fields() -> list[str]:
    return [
        name
        for name, field in Settings.model_fields.items()
        if "SecretStr" in str(field.annotation) or "SecretBytes" in str(field.annotation)
    ]


def _secret_variables(markers: dict[str, str]) -> dict[str, str]:
    """Every secret setting, as the variable that sets it to its marker."""
    out: dict[str, str] = {}
    for name in secret_fields():
        annotation = str(Settings.model_fields[name].annotation)
        if not annotation.startswith("dict"):
            out[f"RHUMBATRON_{name.upper()}"] = markers[name]
            continue
        assert name in MAP_KEYS, (
            f"{name}: a map of secrets; add the key the run may set to MAP_KEYS"
        )
        if name == "kafka":
            out[f"RHUMBATRON_KAFKA__{MAP_KEYS[name]}"] = markers[name]
        else:
            out[f"RHUMBATRON_{name.upper()}"] = json.dumps({MAP_KEYS[name]: markers[name]})
    return out


class Run:
    """The run's processes, all their output kept."""

    def __init__(self, base: dict[str, str]) -> None:
        self.base = base
        self.output: list[tuple[str, str]] = []  # (what, text)

    def cli(self, *args: str, ok: bool = True, env: dict[str, str] | None = None) -> None:
        self.together([args], ok=ok, env=env)

    def together(
        self, commands: list[tuple[str, ...]], *, ok: bool = True, env: dict[str, str] | None = None
    ) -> None:
        """Run these commands at once (each its own process), and wait for them all."""
        procs = [
            (
                args,
                subprocess.Popen(
                    [sys.executable, "-m", "router.cli", "-v", *args],
                    cwd=ROOT,
                    env={**self.base, **(env or {})},
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                ),
            )
            for args in commands
        ]
        for args, proc in procs:
            out, err = proc.communicate(timeout=240)
            self.output += [(f"{args[:2]} stdout", out), (f"{args[:2]} stderr", err)]
            if ok:
                assert proc.returncode == 0, f"{args} exited {proc.returncode}:\n{err[-3000:]}"
            else:
                assert proc.returncode != 0, f"{args} should have failed:\n{err[-3000:]}"

    def found(self, marker: str) -> list[str]:
        return [what for what, text in self.output if marker in text]


@pytest.fixture
def s() -> Iterator[Settings]:
    settings = runtime_settings(make_settings(), connect_timeout_s=5.0)
    yield settings
    cleanup_environment(settings)


@pytest.fixture
def redis_login(s: Settings) -> Iterator[tuple[str, str]]:
    """A Redis ACL user of this test's own; its password is the redis_password marker."""
    admin = redis.Redis.from_url(TEST_REDIS)
    user, password = f"rh-logs-{s.env}", _marker("redis_password")
    admin.execute_command("ACL", "SETUSER", user, "on", f">{password}", "~*", "&*", "+@all")
    try:
        yield user, password
    finally:
        admin.execute_command("ACL", "DELUSER", user)
        admin.close()


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize("log_format", ["json", "text"])
def test_a_full_run_logs_no_secret(
    s: Settings, redis_login: tuple[str, str], tmp_path: Path, log_format: str
) -> None:
    user, redis_password = redis_login
    markers = {name: _marker(name) for name in secret_fields()}
    markers["redis_password"] = redis_password
    # Standard Webhooks secrets have a form of their own: whsec_ and base64 (of a marker).
    http = markers["http_handler_secrets"].encode()
    markers["http_handler_secrets"] = "whsec_" + base64.b64encode(http).decode()
    url_password = _marker("url-password")
    redis_at = urlsplit(TEST_REDIS)
    pg_outbox = f"postgresql://rhumbatron:{quote(url_password)}@127.0.0.1:5432/rhumbatron"
    outbox = tmp_path / "outbox.sqlite"
    env = {k: v for k, v in _secret_variables(markers).items() if k.lower()[11:] not in KAFKA_LOGIN}
    base = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("RHUMBATRON_") or key.startswith("RHUMBATRON_TEST_")
    }
    base.update(s.as_environment())
    base.update(env)
    base.update(
        RHUMBATRON_LOG_FORMAT=log_format,
        RHUMBATRON_REDIS_URL=(
            f"redis://{user}:{url_password}@{redis_at.hostname}:{redis_at.port}{redis_at.path}"
        ),
        RHUMBATRON_ROUTER_OUTBOX_PATH=str(tmp_path / "router.sqlite"),
        RHUMBATRON_OPERATOR_OUTBOXES=json.dumps([str(outbox), pg_outbox]),
        RHUMBATRON_CLASSIFIER_URL=f"http://classifier:{url_password}@{CLOSED}/classify",
        RHUMBATRON_CLASSIFIER_TIMEOUT_S="0.5",
        RHUMBATRON_ARCHIVE_DIR=str(tmp_path / "archive"),
    )
    run = Run(base)

    # The run: the outbox written and published, a poison record, every subscription, a worker.
    run.cli("provision")
    run.cli("produce", "--projects", "2", "--events", "24", "--outbox", str(outbox))
    run.cli("publish", "--outbox", str(outbox), "--until-empty")
    run.together([("produce", "--drill", "garbage"), ("produce", "--drill", "fail")])
    run.together(
        [("consume", "--subscription", slug, "--until-idle", "2") for slug in SUBSCRIPTIONS]
    )
    run.together(
        [
            ("worker", "--queue", "agent-wakeups", "--handler", "ok", "--until-idle", "2"),
            ("config", "show"),
            ("config", "show", "--json"),
        ]
    )
    _ask_the_operator_server(run, markers)

    # The errors: an outbox, an archive store and Kafka logins that refuse the secrets.
    run.cli("produce", "--projects", "1", "--events", "1", "--outbox", pg_outbox, ok=False)
    s3 = {
        "RHUMBATRON_ARCHIVE_STORE": "s3",
        "RHUMBATRON_ARCHIVE_S3_ENDPOINT": f"http://{CLOSED}",
        "RHUMBATRON_ARCHIVE_S3_BUCKET": "rh-logs",
    }
    run.cli("archive", "count", ok=False, env=s3)
    secured = read_client_env(SECURED_DIR)
    scram = {k: v for k, v in secured.items() if k.startswith("RHUMBATRON_KAFKA_")}
    scram["RHUMBATRON_KAFKA_SASL_PASSWORD"] = markers["kafka_sasl_password"]
    scram["RHUMBATRON_KAFKA_SSL_KEY_PASSWORD"] = markers["kafka_ssl_key_password"]
    run.cli("config", "show", env=scram)
    oauth = {
        "RHUMBATRON_KAFKA_BOOTSTRAP": secured["RHUMBATRON_KAFKA_BOOTSTRAP"],
        "RHUMBATRON_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "RHUMBATRON_KAFKA_SSL_CA_FILE": secured["RHUMBATRON_KAFKA_SSL_CA_FILE"],
        "RHUMBATRON_KAFKA_SASL_MECHANISM": "OAUTHBEARER",
        "RHUMBATRON_KAFKA_OAUTH_TOKEN_URL": f"http://{CLOSED}/token",
        "RHUMBATRON_KAFKA_OAUTH_CLIENT_ID": "rh-logs",
        "RHUMBATRON_KAFKA_OAUTH_CLIENT_SECRET": markers["kafka_oauth_client_secret"],
    }
    run.cli("status", ok=False, env=scram)
    run.cli("status", ok=False, env=oauth)

    leaks = {
        what: where for what in [*markers.values(), url_password] if (where := run.found(what))
    }
    assert not leaks, f"secrets shown: {leaks}"
    assert not run.found(MARK), run.found(MARK)
    if log_format == "json":
        _logged_as_json_lines(run)
    else:
        _logged_as_text_lines(run)


def _ask_the_operator_server(run: Run, markers: dict[str, str]) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "router.cli", "-v", "serve", "--port", "0"],
        cwd=ROOT,
        env=run.base,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        run.output.append(("serve stdout", line))
        url = line.split()[3]
        asked = [
            ("api/outboxes", markers["operator_read_token"]),
            ("api/dead-letters", markers["operator_tokens"]),
            ("api/failures", markers["operator_token"]),
            ("api/dead-letters", "not-the-token-" + "x" * 32),
        ]
        for path, token in asked:
            answer = httpx.get(url + path, headers={"Authorization": f"Bearer {token}"}, timeout=60)
            run.output.append((f"serve {path}", answer.text))
        assert answer.status_code == 401
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    run.output += [("serve stdout", out), ("serve stderr", err)]


def _stderr_lines(run: Run) -> list[str]:
    return [
        line for what, text in run.output if what.endswith("stderr") for line in text.splitlines()
    ]


def _logged_as_text_lines(run: Run) -> None:
    """In the text form the log lines are the ones they always were."""
    lines = _stderr_lines(run)
    assert not [line for line in lines if line.startswith('{"ts":')]
    text = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO rhumbatron\.runtime: ledger: ")
    assert [line for line in lines if text.match(line)]


def _logged_as_json_lines(run: Run) -> None:
    """In the JSON form every log line parses, and the runtime's carry where they were."""
    logged = [orjson.loads(line) for line in _stderr_lines(run) if line.startswith('{"ts":')]
    assert logged
    placed = [r for r in logged if r["logger"] == "rhumbatron.runtime" and "subscription" in r]
    assert placed, [r for r in logged if r["logger"] == "rhumbatron.runtime"][:5]
    placed = [r for r in placed if {"topic", "partition", "offset"} <= set(r)]
    assert placed, [r for r in logged if r["logger"] == "rhumbatron.runtime"][:5]


@pytest.mark.parametrize("at", [CLOSED, "127.0.0.1"], ids=["closed-port", "no-port"])
def test_a_classifier_that_fails_names_its_url_without_the_password(
    at: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The run's causal router asks no classifier (the workload declares no overlapping
    resources), so its failures are shown here: urllib quotes the URL's host part, password
    and all, in its own messages."""
    password = _marker("classifier-url")
    classifier = HttpClassifier(
        f"http://user:{password}@{at}/classify",
        key=SecretStr(_marker("classifier_key")),
        timeout_s=0.5,
        max_answer_bytes=100,
    )
    judge = OverlapJudge(classifier, _NoCap(), 10, 0.7, lambda: datetime.now(UTC))
    question = OverlapQuestion(
        project_id="p",
        change_id="c",
        event_id="e",
        event_type="task.resources_declared",
        declaring_agent="a",
        declared=("src/",),
        active_agent="b",
        held=("src/x.py",),
        overlaps=(("src/", "src/x.py"),),
    )
    with caplog.at_level(logging.WARNING):
        assert judge.judge(question) is Verdict.ERROR
    (record,) = caplog.records
    assert f"http://user:****@{at}/classify" in record.getMessage()
    assert MARK not in caplog.text


class _NoCap:
    def incr(self, key: str) -> int:
        return 1
