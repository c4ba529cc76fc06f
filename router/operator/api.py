"""The operator HTTP API and web page over :class:`router.operator.service.OperatorService`.

- First the ``Host`` header: a name not in ``operator_allowed_hosts`` (default: operator_host,
  localhost, 127.0.0.1, [::1]; any port) is refused with 421, against DNS rebinding.
- Then the token, before anything of the request is parsed: every read under ``/api`` but
  ``/api/info`` and ``/api/health`` needs ``Authorization: Bearer <operator_read_token>`` or an
  operator's token; every change (retry, dismiss, one letter or in bulk, dry runs too) needs an
  operator's token: ``operator_token`` (``RHUMBATRON_OPERATOR_TOKEN``, its operator named by
  ``operator_token_name``) or one of ``operator_tokens`` (name → token). 401 without a token or
  with another one; 403 with the read token on a change, or when no token that could allow the
  call is configured.
- The audit record of a change names the operator whose token made it; a body names no one
  (a ``who`` in it is refused with 422). ``/api/session`` says who a token is.
- ``/``, ``/openapi.json``, ``/api/info``, ``/api/health`` and ``/metrics`` carry no payload and
  no secret, and stay open.
- Every error is JSON ``{"reason": …, "field": …}``: 404 names the unknown id, 409 says why a
  letter cannot take the action, 422 names the refused field, 502 names the server that refused
  a request (a Redis error answer), 503 names what is unreachable.
- The OpenAPI document is at ``/openapi.json``; the page at ``/`` (one static file, no CDN).
"""

# No ``from __future__ import annotations`` here: FastAPI reads the route signatures at run
# time, and some name limits taken from settings inside create_app.
import hmac
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Annotated, Any
from urllib.parse import urlsplit

import redis
from fastapi import Depends, FastAPI, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from fastapi.security import HTTPBearer
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException

from consumers.redis_conn import address_of
from router.operator.metrics import registry_for, render
from router.operator.models import (
    NAME_PATTERN,
    SINCE_FORMS,
    SINCE_HELP,
    SINCE_PATTERN,
    SLUG_PATTERN,
    ActionResult,
    BulkResult,
    DeadLetterDetail,
    DeadLetterList,
    ErrorBody,
    FleetReport,
    Health,
    HeldProjectBody,
    Info,
    LagReport,
    LetterKindParam,
    LetterStatusParam,
    OutboxReport,
    RecentFailures,
    Requests,
    Session,
    queue_pattern,
)
from router.operator.service import OperatorService, write_tokens
from router.settings import Settings
from streams.errors import (
    BadInput,
    OperatorError,
    Refused,
    RhumbatronError,
    ServerRefused,
    Unreachable,
)

PAGE = "static/operator.html"
# The page is one file with its script and style inline; it loads nothing from elsewhere.
PAGE_POLICY = (
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
    "connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'"
)


def _error(status: int, reason: str, field: str | None = None) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse(
        ErrorBody(reason=reason, field=field).model_dump(), status_code=status, headers=headers
    )


_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorBody, "description": "no bearer token, or not the read or operator token"},
    403: {"model": ErrorBody, "description": "no read or operator token is configured"},
    421: {"model": ErrorBody, "description": "the Host header is not an allowed host"},
    404: {"model": ErrorBody, "description": "no such dead letter or project view"},
    422: {"model": ErrorBody, "description": "a refused argument (names the field)"},
    502: {"model": ErrorBody, "description": "Kafka or Redis answered with an error"},
    503: {"model": ErrorBody, "description": "Kafka or Redis is unreachable"},
}
_CHANGE_ERRORS: dict[int | str, dict[str, Any]] = {
    **_ERRORS,
    401: {"model": ErrorBody, "description": "no bearer token, or not the operator token"},
    403: {"model": ErrorBody, "description": "the read token, or no operator token configured"},
    409: {"model": ErrorBody, "description": "the dead letter is not open, or cannot be retried"},
}
_BULK_ERRORS = {code: answer for code, answer in _CHANGE_ERRORS.items() if code not in (404, 409)}

LetterId = Annotated[str, Path(description="the dead letter's id (dl_…)", max_length=200)]
ProjectId = Annotated[
    str, Path(description="the project's id", max_length=200, pattern=NAME_PATTERN)
]


_bearer = HTTPBearer(auto_error=False, description="the read token, or an operator's token")
# Open: no payload and no secret in their answers (the page itself asks for the token).
OPEN_PATHS = frozenset({"/", "/openapi.json", "/api/info", "/api/health", "/metrics"})
READS = frozenset({"GET", "HEAD"})


def allowed_hosts(settings: Settings) -> frozenset[str]:
    """The ``Host`` names the server answers, lowercased, without port or brackets."""
    named = settings.operator_allowed_hosts or [
        settings.operator_host,
        "localhost",
        "127.0.0.1",
        "[::1]",
    ]
    return frozenset(_host_name(name) for name in named)


def _host_name(host: str) -> str:
    # urlsplit knows "name:port" and "[v6]:port"; a bare v6 address ("::1") has no port to drop.
    if host.count(":") > 1 and not host.startswith("["):
        return host.lower()
    try:
        return (urlsplit("//" + host).hostname or "").lower()
    except ValueError:  # not a host at all ("[nonsense", a bad port)
        return ""


def _same(sent: str, expected: str) -> bool:
    return bool(expected) and hmac.compare_digest(sent.encode(), expected.encode())


class Access:
    """The tokens this server knows, read once from settings: each operator's write token by
    name, and the read token."""

    def __init__(self, settings: Settings) -> None:
        self.writers = write_tokens(settings)
        token = settings.operator_read_token
        self.read = token.get_secret_value() if token is not None else ""

    def operator_of(self, sent: str) -> str | None:
        # Every token is compared, so the time taken does not tell which one came close.
        found = [name for name, token in self.writers.items() if _same(sent, token)]
        return found[0] if found else None


def _refusal(
    request: Request, access: Access, hosts: frozenset[str]
) -> tuple[JSONResponse | None, str | None]:
    """Why the request is refused before it reaches its route (nothing of it parsed yet), or
    None; and the operator its token names (None: the read token, or no token on an open path).
    A route's own dependencies run after FastAPI has read the body: too late for this."""
    host = request.headers.get("host", "")
    if _host_name(host) not in hosts:
        return _error(
            421,
            f"this server does not answer for Host {host[:200]!r} (allowed: "
            f"{', '.join(sorted(hosts))}); add the name to RHUMBATRON_OPERATOR_ALLOWED_HOSTS",
        ), None
    path = request.url.path
    if path in OPEN_PATHS or not path.startswith("/api/"):
        return None, None
    scheme, _, sent = request.headers.get("authorization", "").partition(" ")
    sent = sent.strip() if scheme.lower() == "bearer" else ""
    operator = access.operator_of(sent) if sent else None
    if request.method in READS:
        if not access.writers and not access.read:
            return _error(
                403,
                "no read token is configured on this server, so every read of dead letters, "
                "failures, outboxes, lag and views is refused: set "
                "RHUMBATRON_OPERATOR_READ_TOKEN (or RHUMBATRON_OPERATOR_TOKEN) and restart",
            ), None
        if not sent:
            return _error(
                401, "this call reads payloads: send 'Authorization: Bearer <read token>'"
            ), None
        if operator is None and not _same(sent, access.read):
            return _error(
                401,
                "the bearer token is not this server's read token or one of its operator tokens",
            ), None
        return None, operator
    if not access.writers:
        return _error(
            403,
            "no operator token is configured on this server, so every retry and dismiss is "
            "refused: set RHUMBATRON_OPERATOR_TOKEN (or RHUMBATRON_OPERATOR_TOKENS) and restart "
            "rhumbatron serve",
        ), None
    if not sent:
        return _error(
            401, "this call changes state: send the header 'Authorization: Bearer <operator token>'"
        ), None
    if operator is not None:
        return None, operator
    if _same(sent, access.read):
        return _error(
            403, "the read token only reads: a retry or dismiss needs an operator's token"
        ), None
    return _error(401, "the bearer token is not one of this server's operator tokens"), None


def _input_of(error: Any) -> str:
    return repr(str(error.get("input"))[:80])


def _operator(request: Request) -> str:
    # Set by the access check, which lets no change through without an operator's token.
    return str(request.state.operator)


def _reason(body: Any) -> str | None:
    # The body models are built per app (their caps come from settings), so typed as Any here.
    return None if body.reason is None else str(body.reason)


def page_html() -> str:
    return resources.files("router.operator").joinpath(PAGE).read_text(encoding="utf-8")


def create_app(service: OperatorService) -> FastAPI:
    settings = service.settings
    app = FastAPI(
        title="Rhumbatron operator API",
        version="1",
        description=__doc__,
        docs_url=None,  # the interactive docs load scripts from a CDN; the document is enough
        redoc_url=None,
        openapi_url="/openapi.json",
    )
    app.state.service = service
    html = page_html()
    bodies = Requests(settings.operator_text_max_chars, settings.topology.queues)
    queues = queue_pattern(settings.topology.queues)
    RetryBody, DismissBody = bodies.retry, bodies.dismiss
    BulkRetryBody, BulkDismissBody = bodies.bulk_retry, bodies.bulk_dismiss
    access = Access(settings)

    # The check is the middleware; the dependency marks the routes secured in the document.
    Authorized = Depends(_bearer)
    hosts = allowed_hosts(settings)

    @app.middleware("http")
    async def _access(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        refused, operator = _refusal(request, access, hosts)
        if refused is not None:
            return refused
        request.state.operator = operator
        return await call_next(request)

    # -- errors: always JSON with a reason ------------------------------------------------------
    @app.exception_handler(OperatorError)
    def _operator_error(request: Request, exc: OperatorError) -> JSONResponse:
        return _error(exc.status, str(exc), exc.field if isinstance(exc, BadInput) else None)

    @app.exception_handler(Refused)
    def _refused(request: Request, exc: Refused) -> JSONResponse:
        return _error(exc.status, str(exc))

    @app.exception_handler(Unreachable)
    def _unreachable(request: Request, exc: Unreachable) -> JSONResponse:
        return _error(503, str(exc))

    @app.exception_handler(ServerRefused)
    def _server_refused(request: Request, exc: ServerRefused) -> JSONResponse:
        return _error(502, str(exc))

    @app.exception_handler(redis.RedisError)
    def _redis_error(request: Request, exc: redis.RedisError) -> JSONResponse:
        where = address_of(settings.redis_url)
        return _error(503, f"Redis at {where} failed: {type(exc).__name__}: {exc}")

    @app.exception_handler(RhumbatronError)
    def _ours(request: Request, exc: RhumbatronError) -> JSONResponse:
        return _error(500, f"{type(exc).__name__}: {exc}")

    @app.exception_handler(RequestValidationError)
    def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0]
        loc = [str(part) for part in first.get("loc", ())]
        where = loc[0] if loc else "request"
        named = [part for part in loc[1:] if not part.isdigit()]
        message = first.get("msg", "invalid")
        if named[-1:] == ["since"] and first.get("type") == "string_pattern_mismatch":
            return _error(
                422, f"{where} field 'since' takes {SINCE_FORMS}; got {_input_of(first)}", "since"
            )
        if named == ["who"] and first.get("type") == "extra_forbidden":
            return _error(
                422,
                "body field 'who' is not accepted: the audit log names the operator whose token "
                "made the call (operator_token_name, operator_tokens); drop the field",
                "who",
            )
        if not named:  # the whole body: not JSON, or not an object
            return _error(422, f"the request {where} was refused: {message}", where)
        shown = first.get("input")
        got = "" if isinstance(shown, dict) or shown is None else f" (got {str(shown)[:120]!r})"
        return _error(422, f"{where} field {named[-1]!r}: {message}{got}", named[-1])

    @app.exception_handler(StarletteHTTPException)
    def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        reason = str(exc.detail)
        if exc.status_code == 404 and reason == "Not Found":
            reason = (
                f"no such endpoint: {request.method} {request.url.path} "
                "(the API is described at /openapi.json)"
            )
        elif exc.status_code == 405:
            reason = f"{request.method} is not allowed on {request.url.path}"
        return _error(exc.status_code, reason)

    @app.exception_handler(Exception)
    def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        return _error(500, f"internal error: {type(exc).__name__}: {exc}")

    # -- the page --------------------------------------------------------------------------------
    @app.get("/", include_in_schema=False)
    def page() -> HTMLResponse:
        return HTMLResponse(
            html,
            headers={"Content-Security-Policy": PAGE_POLICY, "Cache-Control": "no-store"},
        )

    # -- reads -----------------------------------------------------------------------------------
    @app.get("/api/session", tags=["service"], responses=_ERRORS, dependencies=[Authorized])
    def session(request: Request) -> Session:
        """Who the bearer token is: an operator (by name) who may retry and dismiss, or the read
        token; and whether the server is read-only (no operator token configured)."""
        return service.session(request.state.operator)

    @app.get("/api/info", tags=["service"])
    def info() -> Info:
        """The environment, the page's refresh interval, whether changes are possible."""
        return service.info()

    @app.get(
        "/api/health",
        tags=["service"],
        response_model=Health,
        responses={503: {"model": Health, "description": "Kafka or Redis is unreachable"}},
    )
    def health() -> Any:
        """Whether Kafka and Redis answer (each probe bounded by operator_health_timeout_s)."""
        found = service.health()
        if not found.ok:
            return JSONResponse(found.model_dump(), status_code=503)
        return found

    @app.get(
        "/api/dead-letters", tags=["dead letters"], responses=_ERRORS, dependencies=[Authorized]
    )
    def list_dead_letters(
        status: LetterStatusParam | None = None,
        kind: LetterKindParam | None = None,
        subscription: Annotated[str | None, Query(pattern=SLUG_PATTERN)] = None,
        queue: Annotated[str | None, Query(pattern=queues, description="origin queue")] = None,
        since: Annotated[str | None, Query(pattern=SINCE_PATTERN, description=SINCE_HELP)] = None,
        limit: Annotated[
            int | None,
            Query(ge=1, le=settings.operator_page_size, description="operator_page_size at most"),
        ] = None,
    ) -> DeadLetterList:
        """Dead letters of every kind (event batches, poison records, commands), newest first."""
        return service.list_dead_letters(
            status=status,
            kind=kind,
            subscription=subscription,
            queue=queue,
            since=since,
            limit=limit,
        )

    @app.get(
        "/api/dead-letters/{letter_id}",
        tags=["dead letters"],
        responses=_ERRORS,
        dependencies=[Authorized],
    )
    def show_dead_letter(letter_id: LetterId) -> DeadLetterDetail:
        """One letter with its original bytes (decoded as JSON when they are JSON), its headers
        and its audit trail."""
        return service.dead_letter(letter_id)

    @app.get("/api/failures", tags=["dead letters"], responses=_ERRORS, dependencies=[Authorized])
    def recent_failures() -> RecentFailures:
        """The newest dead letters (any status) and the outboxes' failed rows."""
        return service.recent_failures()

    @app.get("/api/outboxes", tags=["outboxes"], responses=_ERRORS, dependencies=[Authorized])
    def outboxes() -> list[OutboxReport]:
        """Rows by state, the oldest unpublished row's age, failed rows and held projects, for
        each configured outbox (operator_outboxes; default: the router's)."""
        return service.outboxes()

    @app.get("/api/held-projects", tags=["outboxes"], responses=_ERRORS, dependencies=[Authorized])
    def held_projects() -> list[HeldProjectBody]:
        """Projects whose next row failed to publish, in every configured outbox."""
        return service.held_projects()

    scrape = registry_for(service)

    @app.get("/metrics", include_in_schema=False)
    def metrics() -> Response:
        """Prometheus scrape: lag, outbox depth and held projects, dead letters, workers."""
        return Response(render(scrape), media_type=CONTENT_TYPE_LATEST)

    @app.get("/api/lag", tags=["consumers"], responses=_ERRORS, dependencies=[Authorized])
    def lag() -> LagReport:
        """Consumer lag per subscription (consumer group) and partition."""
        return service.lag()

    @app.get("/api/fleet", tags=["consumers"], responses=_ERRORS, dependencies=[Authorized])
    def fleet() -> FleetReport:
        """The fleet on this server's host: each process, its pid, restarts, partitions, lag."""
        return service.fleet()

    @app.get(
        "/api/projects/{project_id}/view",
        tags=["projects"],
        responses=_ERRORS,
        dependencies=[Authorized],
    )
    def project_view(project_id: ProjectId) -> dict[str, Any]:
        """The project's view kept by project-view-projector."""
        return service.project_view(project_id)

    @app.get(
        "/api/projects/{project_id}/feed",
        tags=["projects"],
        responses=_ERRORS,
        dependencies=[Authorized],
    )
    def project_feed(project_id: ProjectId) -> list[dict[str, Any]]:
        """The project's recent events, newest applied first."""
        return service.project_feed(project_id)

    # -- changes (an operator's token) -----------------------------------------------------------
    @app.post(
        "/api/dead-letters/retry",
        tags=["dead letters"],
        responses=_BULK_ERRORS,
        dependencies=[Authorized],
    )
    def bulk_retry(
        request: Request,
        body: BulkRetryBody,  # type: ignore[valid-type]
    ) -> BulkResult:
        """Retry every dead letter the filter matches (default: the open ones), at most
        operator_bulk_limit per call, oldest first, each through the single retry (each audited
        on its own; one handled by someone else meanwhile is skipped). A dry run lists what it
        would retry and touches nothing; it needs an operator's token too."""
        asked: Any = body
        return service.bulk_retry(
            asked.filter, dry_run=asked.dry_run, operator=_operator(request), reason=_reason(asked)
        )

    @app.post(
        "/api/dead-letters/dismiss",
        tags=["dead letters"],
        responses=_BULK_ERRORS,
        dependencies=[Authorized],
    )
    def bulk_dismiss(
        request: Request,
        body: BulkDismissBody,  # type: ignore[valid-type]
    ) -> BulkResult:
        """Dismiss every open dead letter the filter matches, as the bulk retry does."""
        asked: Any = body
        return service.bulk_dismiss(
            asked.filter, dry_run=asked.dry_run, operator=_operator(request), reason=asked.reason
        )

    @app.post(
        "/api/dead-letters/{letter_id}/retry",
        tags=["dead letters"],
        responses=_CHANGE_ERRORS,
        dependencies=[Authorized],
    )
    def retry_dead_letter(
        request: Request,
        letter_id: LetterId,
        body: RetryBody,  # type: ignore[valid-type]
    ) -> ActionResult:
        """Events go back to their subscription alone; a command goes back to its origin queue,
        once (a second retry is refused with 409). Audited, naming the token's operator."""
        return service.retry(letter_id, who=_operator(request), reason=_reason(body))

    @app.post(
        "/api/dead-letters/{letter_id}/dismiss",
        tags=["dead letters"],
        responses=_CHANGE_ERRORS,
        dependencies=[Authorized],
    )
    def dismiss_dead_letter(
        request: Request,
        letter_id: LetterId,
        body: DismissBody,  # type: ignore[valid-type]
    ) -> ActionResult:
        """Close the letter without a retry; the reason goes to its audit trail, with the
        token's operator."""
        return service.dismiss(letter_id, who=_operator(request), reason=_reason(body) or "")

    return app
