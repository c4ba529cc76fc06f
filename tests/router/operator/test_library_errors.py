"""The operator service and its HTTP API over servers that fail: no redis-py or librdkafka error
reaches a caller. The service raises ours (Unreachable, ServerRefused), the API answers them as
JSON naming the server (503: no answer, 502: an error answer), never a 500."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from pydantic import SecretStr

from consumers.redis_conn import connect
from consumers.runtime.types import TP
from consumers.subscriptions.projector.processor import view_key
from consumers.subscriptions.projector.view import _store
from router.operator.service import OperatorService
from router.settings import Settings
from streams.errors import ServerRefused, Unreachable
from tests.support.environment import cleanup_environment, make_settings
from tests.support.operator import running_server

pytestmark = pytest.mark.integration

NOBODY = "127.0.0.1:1"  # loopback port 1: nothing listens, every connection is refused at once
TOKEN = "op-token-for-library-errors-0123456789"


def _http(s: Settings) -> Iterator[httpx.Client]:
    service = OperatorService(s)
    try:
        with running_server(service) as url, httpx.Client(base_url=url, timeout=60) as client:
            yield client
    finally:
        service.close()


@pytest.fixture
def down() -> Iterator[httpx.Client]:
    s = make_settings(
        kafka_bootstrap=NOBODY,
        redis_url=f"redis://{NOBODY}/0",
        connect_timeout_s=1.0,
        operator_health_timeout_s=1.0,
        operator_token=SecretStr(TOKEN),
    )
    yield from _http(s)


@pytest.mark.parametrize(
    ("method", "path", "server"),
    [
        ("get", "/api/dead-letters", "Redis"),
        ("get", "/api/dead-letters/dl_nope", "Redis"),
        ("get", "/api/failures", "Redis"),
        ("get", "/api/projects/proj-1/view", "Redis"),
        ("get", "/api/projects/proj-1/feed", "Redis"),
        ("get", "/api/lag", "Kafka"),
        ("post", "/api/dead-letters/dl_nope/retry", "Redis"),
        ("post", "/api/dead-letters/dl_nope/dismiss", "Redis"),
    ],
)
def test_an_unreachable_server_is_a_503_naming_it(
    down: httpx.Client, method: str, path: str, server: str
) -> None:
    response = down.request(
        method.upper(),
        path,
        json={"reason": "drill"} if method == "post" else None,
        headers={"Authorization": f"Bearer {TOKEN}"},
    )
    assert response.status_code == 503, response.text
    body = response.json()
    assert set(body) == {"reason", "field"} and body["field"] is None
    assert f"{server} at {NOBODY} is unreachable" in body["reason"]
    assert "Traceback" not in body["reason"] and "internal error" not in body["reason"]


@pytest.fixture
def stranger() -> Iterator[tuple[Settings, httpx.Client]]:
    """An environment whose keys something else overwrote with values of another type."""
    s = make_settings(operator_read_token=TOKEN)
    client = connect(s.redis_url, timeout=5)
    client.set(f"rh:{s.env}:{{dead-letters}}:index", b"not a sorted set")
    topic, partition = s.topology.partition_of("proj-1")
    client.set(_store(client, s.env).key(TP(topic, partition), view_key("proj-1", "counts")), b"x")
    try:
        for http in _http(s):
            yield s, http
    finally:
        cleanup_environment(s)
        client.close()


def test_a_redis_error_answer_is_ours_from_the_service(
    stranger: tuple[Settings, httpx.Client],
) -> None:
    s, _ = stranger
    service = OperatorService(s)
    try:
        with pytest.raises(ServerRefused, match="Redis at .* refused the request: listing"):
            service.list_dead_letters()
        with pytest.raises(ServerRefused, match="view of project 'proj-1'.*WRONGTYPE"):
            service.project_view("proj-1")
    finally:
        service.close()


@pytest.mark.parametrize(
    ("path", "said"),
    [
        ("/api/dead-letters", "listing the dead letters"),
        ("/api/failures", "listing the dead letters"),
        ("/api/projects/proj-1/view", "reading the view of project 'proj-1'"),
    ],
)
def test_a_redis_error_answer_is_a_502_naming_redis(
    stranger: tuple[Settings, httpx.Client], path: str, said: str
) -> None:
    _, http = stranger
    response = http.get(path, headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 502, response.text
    reason = response.json()["reason"]
    assert "Redis at 127.0.0.1:" in reason and said in reason and "WRONGTYPE" in reason


def test_the_service_says_unreachable_not_a_redis_error() -> None:
    s = make_settings(redis_url=f"redis://{NOBODY}/0", connect_timeout_s=1.0)
    service = OperatorService(s)
    for call in (service.list_dead_letters, service.recent_failures):
        with pytest.raises(Unreachable, match=f"Redis at {NOBODY}"):
            call()
    with pytest.raises(Unreachable, match=f"Redis at {NOBODY}"):
        service.dismiss("dl_nope", who="ann", reason="drill")
