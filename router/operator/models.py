"""The shapes the operator surface answers with — one definition for the HTTP API (its OpenAPI
document), the web page and ``rhumbatron dead-letters … --json`` — and a dead letter turned
into them (its bytes decoded where they are JSON or text)."""

from __future__ import annotations

import base64
import re
from collections.abc import Sequence
from enum import StrEnum
from typing import Annotated, Any

import orjson
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    GetPydanticSchema,
    StringConstraints,
    create_model,
)
from pydantic_core import core_schema

from consumers.runtime.dead_letters import DeadLetter, Entry, LetterKind, LetterStatus
from streams.topology import QUEUE_NAME_MAX


def _one_of(values: type[StrEnum]) -> GetPydanticSchema:
    """A parameter taking one of ``values``' strings, handed on as the member. Annotated on
    ``str``, not on the enum: for an enum FastAPI adds a shared schema to the OpenAPI document,
    and the document states each closed set inline where it is used, as clients have it."""
    strings = core_schema.literal_schema([v.value for v in values])
    return GetPydanticSchema(
        lambda _type, _handler: core_schema.no_info_after_validator_function(values, strings)
    )


LetterStatusParam = Annotated[str, _one_of(LetterStatus)]


def _status_among(*statuses: LetterStatus) -> Any:
    """A letter status limited to ``statuses`` (the ones an action can take), so the document
    offers no status the call would refuse."""
    strings = core_schema.literal_schema([s.value for s in statuses])
    return Annotated[
        str,
        GetPydanticSchema(
            lambda _type, _handler: core_schema.no_info_after_validator_function(
                LetterStatus, strings
            )
        ),
    ]


LetterKindParam = Annotated[str, _one_of(LetterKind)]

# streams.topology.check_slug's rule, stated for the OpenAPI document.
SLUG_PATTERN = r"^[a-z][a-z0-9-]{0,60}$"
# streams.envelopes' rule for names such as a project id.
NAME_PATTERN = r"^[^\x00-\x1f]+$"
# streams.topology.check_queue's shape of a queue's name (its length is max_length, QUEUE_NAME_MAX),
# where the settings' queues are not at hand (a --filter read by the command line): the service
# checks the name is one of them. The HTTP API's document states them: queue_pattern.
QUEUE_PATTERN = r"^[a-z](-?[a-z0-9])*$"
# What ``since`` takes, stated for the OpenAPI document so that every value it allows is one the
# service accepts: a duration back from now (1 to 99999 of s, m, h or d), or an ISO 8601 date or
# time of 1900-2099 (a real calendar day; UTC unless it names an offset).
_HH, _MM = r"([01][0-9]|2[0-3])", r"[0-5][0-9]"
_DAY = (
    r"(19|20)[0-9][0-9]-((0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])|(0[13-9]|1[0-2])-(29|30)|(0[13578]|1[02])-31)"
    r"|(19([02468][48]|[13579][26]|[2468]0)|20([02468][048]|[13579][26]))-02-29"
)
SINCE_PATTERN = rf"^([1-9][0-9]{{0,4}}[smhd]|({_DAY})(T{_HH}:{_MM}(:{_MM}(\.[0-9]{{1,6}})?)?(Z|[+-]{_HH}:{_MM})?)?)$"
SINCE_FORMS = (
    "a duration back from now (90s, 30m, 2h, 7d) or an ISO 8601 time "
    "(2026-01-31T09:00:00Z; UTC when it names no offset)"
)
SINCE_HELP = "created at or after: " + SINCE_FORMS


def queue_pattern(queues: Sequence[str]) -> str:
    """The settings' queues as a pattern, so the document states the closed set the service
    takes."""
    return "^(" + "|".join(re.escape(q) for q in queues) + ")$"


class _Shape(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ErrorBody(_Shape):
    reason: str = Field(description="what was wrong, with the value, and what to do")
    field: str | None = Field(None, description="the input field that was refused, if any")


class AuditEntryBody(_Shape):
    action: str
    who: str
    why: str
    at: str


class DeadLetterSummary(_Shape):
    id: str
    kind: str = Field(description="event-batch, poison or command")
    status: str = Field(description="open, retrying, retried or dismissed")
    subscription: str | None
    origin_queue: str | None
    command_id: str | None
    source: str = Field(description="topic[partition] the letter's records came from")
    offsets: list[int]
    events: list[str | None]
    error_type: str
    error: str
    attempts: int
    created_at: str
    last_action: AuditEntryBody | None = Field(
        None, description="the latest operator action (retry, dismiss), if any"
    )


class Header(_Shape):
    name: str
    text: str | None = Field(description="the value as UTF-8 text; null when it is not text")
    b64: str | None = Field(description="the value, base64; null when the header has none")


class DeadLetterEntry(_Shape):
    offset: int
    event_id: str | None
    event_type: str | None
    project_id: str | None
    key: str | None = Field(description="the record key as UTF-8 text (null: none or binary)")
    value_b64: str | None = Field(description="the original bytes, base64")
    value_is_json: bool
    value_json: Any = Field(None, description="the original bytes decoded, when valid JSON")
    value_text: str | None = Field(None, description="the bytes as text, when UTF-8 but not JSON")
    headers: list[Header]


class DeadLetterDetail(DeadLetterSummary):
    source_topic: str
    source_partition: int
    entries: list[DeadLetterEntry]
    audit: list[AuditEntryBody]


class DeadLetterList(_Shape):
    items: list[DeadLetterSummary] = Field(description="newest first")
    matched: int = Field(description="letters that matched the filters (items is at most limit)")
    truncated: bool = Field(
        description="true when the store held more letters than one listing reads "
        "(operator_dead_letter_scan_limit): narrow the filters"
    )


class DeadLetterFilter(_Shape):
    """Which dead letters a bulk retry or dismiss acts on (every condition given must hold)."""

    subscription: str | None = Field(None, pattern=SLUG_PATTERN)
    kind: LetterKindParam | None = None
    queue: str | None = Field(
        None, pattern=QUEUE_PATTERN, max_length=QUEUE_NAME_MAX, description="origin queue"
    )
    status: LetterStatusParam | None = Field(
        None,
        description="default: the letters the action can take: open ones (and, for a retry, "
        "retrying ones, taken over once their sender is stale)",
    )
    since: str | None = Field(None, pattern=SINCE_PATTERN, description=SINCE_HELP)


FILTER_KEYS = tuple(DeadLetterFilter.model_fields)


class Requests:
    """The bodies of the changes, their text capped at ``max_chars`` (operator_text_max_chars). A
    reason must hold more than blanks: it goes to the audit log. None names who acts: the audit
    names the operator whose token made the call (operator_token_name, operator_tokens)."""

    def __init__(self, max_chars: int, queues: Sequence[str]) -> None:
        # Python strips \x1c-\x1f and \x85 as blanks, which a JSON Schema's \S takes for text:
        # the pattern names them, so the document refuses every reason the server would.
        text = Annotated[
            str,
            StringConstraints(
                strip_whitespace=True,
                min_length=1,
                max_length=max_chars,
                pattern=r"[^\s\x1c-\x1f\x85]",
            ),
        ]
        optional_reason: Any = (text | None, Field(None, description="why (for the audit log)"))
        reason: Any = (text, Field(description="why the letters are closed without a retry"))
        self.retry: type[BaseModel] = create_model(
            "RetryRequest", __base__=_Shape, reason=optional_reason
        )
        self.dismiss: type[BaseModel] = create_model(
            "DismissRequest",
            __base__=_Shape,
            reason=(text, Field(description="why the letter is closed without a retry")),
        )
        # A dry run takes the same body as the real run: flip dry_run, nothing else.
        dry_run = (bool, Field(False, description="list what the call would touch; touch nothing"))
        self.bulk_retry: type[BaseModel] = create_model(
            "BulkRetryRequest",
            __base__=_Shape,
            filter=_filter("RetryFilter", queues, LetterStatus.OPEN, LetterStatus.RETRYING),
            dry_run=dry_run,
            reason=optional_reason,
        )
        self.bulk_dismiss: type[BaseModel] = create_model(
            "BulkDismissRequest",
            __base__=_Shape,
            filter=_filter("DismissFilter", queues, LetterStatus.OPEN),
            dry_run=dry_run,
            reason=reason,
        )


def _filter(name: str, queues: Sequence[str], *statuses: LetterStatus) -> Any:
    """The filter of a bulk action, its queue one of ``queues`` and its status limited to those
    the action takes."""
    model = create_model(
        name,
        __base__=DeadLetterFilter,
        queue=(str | None, Field(None, pattern=queue_pattern(queues), description="origin queue")),
        status=(
            _status_among(*statuses) | None,
            Field(None, description=DeadLetterFilter.model_fields["status"].description),
        ),
    )
    return (model, Field(default_factory=model))


class ActionResult(_Shape):
    dead_letter: DeadLetterDetail
    outcome: str = Field(description="what was done, in one line")


class BulkLetter(_Shape):
    id: str
    kind: str
    status: str = Field(description="the letter's status when it was matched")
    origin: str | None = Field(description="its subscription, or a command's origin queue")
    error: str
    outcome: str = Field(
        description="retried, dismissed, would retry, would dismiss (a dry run), skipped or failed"
    )
    detail: str = Field(description="what was done, or why not")


class BulkResult(_Shape):
    action: str = Field(description="retry or dismiss")
    dry_run: bool
    operator: str = Field(description="who the audit records name")
    matched: int = Field(description="letters the filter matched")
    acted: int = Field(description="letters acted on (a dry run: that it would act on)")
    skipped: int = Field(description="matched letters the action cannot take (see their detail)")
    failed: int = Field(description="letters whose action failed (open again; the run stopped)")
    untouched: int = Field(description="matched letters not attempted (see untouched_reason)")
    untouched_reason: str | None = None
    limit: int = Field(description="most letters one call acts on (operator_bulk_limit)")
    truncated: bool = Field(
        description="true when the store held more letters than one call reads "
        "(operator_dead_letter_scan_limit): narrow the filter"
    )
    letters: list[BulkLetter] = Field(
        description="the letters acted on (or that a dry run would act on), skipped or failed, "
        "oldest first"
    )


class FailedRow(_Shape):
    outbox: str
    event_id: str
    project_id: str
    slot: int
    event_type: str
    attempts: int
    last_error: str | None


class HeldProjectBody(_Shape):
    outbox: str
    project_id: str
    failed_event_id: str
    failed_slot: int
    rows_waiting: int


class OutboxReport(_Shape):
    outbox: str = Field(description="the outbox file")
    present: bool = Field(description="false: the file does not exist (yet)")
    error: str | None = Field(None, description="why its figures could not be read")
    counts: dict[str, int] = Field(default_factory=dict, description="rows by state")
    total: int = 0
    oldest_pending_age_s: float | None = None
    failed_rows: list[FailedRow] = Field(default_factory=list)
    held_projects: list[HeldProjectBody] = Field(default_factory=list)
    lists_truncated_at: int = Field(description="failed rows and held projects listed at most")


class PartitionLagBody(_Shape):
    topic: str
    partition: int
    committed: int | None = Field(description="the group's committed offset (null: none yet)")
    end: int = Field(description="the log end offset")
    lag: int


class SubscriptionLag(_Shape):
    subscription: str
    group: str
    kind: str = Field(
        description="subscription (reads the streams), command-worker (reads a queue) or other"
    )
    total_lag: int
    partitions: list[PartitionLagBody]


class LagReport(_Shape):
    env: str
    subscriptions: list[SubscriptionLag]


class FleetMemberBody(_Shape):
    name: str
    argv: list[str] = Field(description="its rhumbatron command line")
    subscription: str | None = Field(description="the subscription whose group it is in")
    state: str = Field(description="starting, running, backoff, stopping, stopped or failed")
    pid: int | None
    restarts: int
    started_at: float | None = Field(description="when its current process started (epoch s)")
    last_exit: int | None = Field(description="its last process's exit code (< 0: a signal)")
    partitions: list[str] | None = Field(description="a subscription member's partitions")
    lag: int | None = Field(description="the lag of a subscription member's partitions")


class FleetReport(_Shape):
    env: str
    state: str = Field(
        description="running, stopping, stopped, failed, gone (its supervisor died) or none "
        "(no fleet of the environment has run on the server's host)"
    )
    pid: int | None
    updated_at: float | None = Field(description="when the fleet last wrote its status (epoch s)")
    members: list[FleetMemberBody]


class RecentFailures(_Shape):
    dead_letters: list[DeadLetterSummary] = Field(description="newest first, any status")
    outbox_failed_rows: list[FailedRow]


class Probe(_Shape):
    ok: bool
    address: str
    detail: str


class Health(_Shape):
    ok: bool
    env: str
    kafka: Probe
    redis: Probe
    reason: str | None = Field(None, description="what is unreachable, when not ok")


class Session(_Shape):
    env: str
    operator: str | None = Field(
        description="the operator the bearer token belongs to (null: the read token)"
    )
    can_act: bool = Field(description="whether this token may retry and dismiss")
    read_only: bool = Field(
        description="true: no operator token is configured, every retry and dismiss is refused"
    )


class Info(_Shape):
    env: str
    refresh_s: float = Field(description="how often the page refreshes itself")
    mutations_enabled: bool = Field(
        description="false: no operator token is configured, every retry and dismiss is refused"
    )
    page_size: int


# -- a dead letter as the faces show it -----------------------------------------------------------
def summary_of(letter: DeadLetter) -> DeadLetterSummary:
    audit = letter.audit
    return DeadLetterSummary(
        **letter.summary(), last_action=AuditEntryBody(**audit[-1]) if audit else None
    )


def detail_of(letter: DeadLetter) -> DeadLetterDetail:
    return DeadLetterDetail(
        **summary_of(letter).model_dump(),
        source_topic=letter.source_topic,
        source_partition=letter.source_partition,
        entries=[entry_of(e) for e in letter.entries],
        audit=[AuditEntryBody(**a) for a in letter.audit],
    )


def entry_of(entry: Entry) -> DeadLetterEntry:
    value_json: Any = None
    is_json = False
    text = None
    if entry.value is not None:
        try:
            value_json = orjson.loads(entry.value)
            # Within the answer's own nesting, JSON nested deeper than a writer goes (a poison
            # record's) failed the whole answer: such a value is shown as its text.
            orjson.dumps([[[[[[[[value_json]]]]]]]])
            is_json = True
        except orjson.JSONDecodeError:
            text = _utf8(entry.value)
        except TypeError:
            value_json, text = None, _utf8(entry.value)
    return DeadLetterEntry(
        offset=entry.offset,
        event_id=entry.event_id,
        event_type=entry.event_type,
        project_id=entry.project_id,
        key=_utf8(entry.key),
        value_b64=_b64(entry.value),
        value_is_json=is_json,
        value_json=value_json,
        value_text=text,
        headers=[Header(name=k, text=_utf8(v), b64=_b64(v)) for k, v in entry.headers],
    )


def _utf8(raw: bytes | None) -> str | None:
    if raw is None:
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _b64(raw: bytes | None) -> str | None:
    return base64.b64encode(raw).decode() if raw is not None else None


def bulk_row_of(letter: DeadLetter, outcome: str, detail: str) -> BulkLetter:
    return BulkLetter(
        id=letter.id,
        kind=letter.kind,
        status=letter.status,
        origin=letter.subscription or letter.origin_queue,
        error=letter.error,
        outcome=outcome,
        detail=detail,
    )
