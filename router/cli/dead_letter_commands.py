"""Dead letters from the command line: list, show, retry, dismiss — one letter by its id, or in
bulk with ``--filter`` — over the operator service (the same code as the HTTP API and the page).
Whoever runs these has a shell on the machine: the audit log names the login user, or ``--who``.
"""

from __future__ import annotations

import argparse
import sys
from typing import Literal

from pydantic import ValidationError

from consumers.runtime.dead_letters import LetterKind, LetterStatus
from router.cli.common import QUEUE_HELP, known_queue, operator_name, positive_int, print_json
from router.operator.models import FILTER_KEYS, SINCE_FORMS, BulkResult, DeadLetterFilter
from router.operator.service import OperatorService
from router.settings import Settings
from streams.errors import BadInput

_WHO = "operator name for the audit log (default: the login name)"
_FILTER = (
    "act on every letter matching KEY=VALUE[,KEY=VALUE…] instead of one ID; keys: "
    + ", ".join(FILTER_KEYS)
    + " (since: 90s, 30m, 2h, 7d or an ISO 8601 time such as 2026-01-31T09:00:00Z); status defaults to the letters the action "
    "can take"
)


def dead_letters_list(settings: Settings, args: argparse.Namespace) -> int:
    service = OperatorService(settings)
    try:
        found = service.list_dead_letters(
            status=args.status,
            kind=args.kind,
            subscription=args.subscription,
            queue=known_queue(settings.topology, args.queue),
            since=args.since,
            limit=args.limit,
        )
    finally:
        service.close()
    if args.json:
        print_json([d.model_dump() for d in found.items])
    elif not found.items:
        print("no dead letters")
    else:
        width = max(len(d.id) for d in found.items)
        print(f"{'ID':<{width}}  {'STATUS':<9} {'KIND':<12} {'FROM':<24} ERROR")
        for d in found.items:
            print(
                f"{d.id:<{width}}  {d.status:<9} {d.kind:<12} "
                f"{d.subscription or d.origin_queue or '-':<24} {d.error[:80]}"
            )
    if found.matched > len(found.items) or found.truncated:
        more = "+" if found.truncated else ""
        print(
            f"(showing {len(found.items)} of {found.matched}{more}, newest first)", file=sys.stderr
        )
    return 0


def dead_letters_show(settings: Settings, args: argparse.Namespace) -> int:
    service = OperatorService(settings)
    try:
        print_json(service.dead_letter(args.id).model_dump())
    finally:
        service.close()
    return 0


def dead_letters_retry(settings: Settings, args: argparse.Namespace) -> int:
    return _act(settings, args, "retry")


def dead_letters_dismiss(settings: Settings, args: argparse.Namespace) -> int:
    return _act(settings, args, "dismiss")


def _act(settings: Settings, args: argparse.Namespace, action: Literal["retry", "dismiss"]) -> int:
    """One letter (``ID``) or every letter a ``--filter`` matches, through the service's one path
    for each."""
    chosen = _one_or_filter(args)
    service = OperatorService(settings)
    who = operator_name(args.who)
    try:
        if chosen is not None:
            bulk = service.bulk_retry if action == "retry" else service.bulk_dismiss
            found = bulk(chosen, dry_run=args.dry_run, operator=who, reason=args.reason)
            return _report(found, args.json)
        single = service.retry if action == "retry" else service.dismiss
        result = single(args.id, who=who, reason=args.reason)
    finally:
        service.close()
    if args.json:
        print_json(result.model_dump())
    else:
        print(f"{args.id}: {result.dead_letter.status}; {result.outcome}")
    return 0


def _one_or_filter(args: argparse.Namespace) -> DeadLetterFilter | None:
    """The bulk filter, or None for the one letter ``args.id``; refuses both, or neither."""
    if args.id is not None and args.filter is not None:
        raise BadInput("filter", "give a letter ID or --filter, not both")
    if args.id is None and args.filter is None:
        raise BadInput("id", "give a letter ID, or --filter KEY=VALUE[,…] for many letters")
    if args.filter is None:
        if args.dry_run:
            raise BadInput("dry-run", "--dry-run goes with --filter (one letter: show it first)")
        return None
    return parse_filter(args.filter)


def parse_filter(text: str) -> DeadLetterFilter:
    """``subscription=ledger,kind=event-batch,since=2h`` → the filter; a refusal names the key."""
    given: dict[str, str] = {}
    for part in text.split(","):
        key, equals, value = (piece.strip() for piece in part.partition("="))
        if not equals or not key or not value:
            raise BadInput(
                "filter", f"--filter takes KEY=VALUE pairs separated by commas, got {part!r}"
            )
        if key not in FILTER_KEYS:
            raise BadInput("filter", f"--filter key {key!r} is not one of {', '.join(FILTER_KEYS)}")
        if key in given:
            raise BadInput("filter", f"--filter names {key!r} twice")
        given[key] = value
    try:
        return DeadLetterFilter.model_validate(given)
    except ValidationError as exc:
        problem = exc.errors(include_url=False)[0]
        key = str(problem["loc"][0])
        why = f"since takes {SINCE_FORMS}" if key == "since" else problem["msg"]
        raise BadInput(key, f"--filter {key}={given[key]!r} is refused: {why}") from None


def _report(found: BulkResult, as_json: bool) -> int:
    """Prints the result; 1 when a letter's action failed (the run stopped there)."""
    if as_json:
        print_json(found.model_dump())
        return 1 if found.failed else 0
    if found.letters:
        width = max(len(d.id) for d in found.letters)
        print(f"{'ID':<{width}}  {'OUTCOME':<13} {'KIND':<12} {'FROM':<24} ERROR / DETAIL")
        for d in found.letters:
            shown = d.error if d.outcome.startswith("would") else d.detail
            print(
                f"{d.id:<{width}}  {d.outcome:<13} {d.kind:<12} {d.origin or '-':<24} {shown[:100]}"
            )
    verb = {"retry": "retried", "dismiss": "dismissed"}[found.action]
    did = f"would be {verb}" if found.dry_run else verb
    line = (
        f"{found.matched} matched: {found.acted} {did} by {found.operator}, {found.skipped} skipped"
    )
    if found.failed:
        line += f", {found.failed} failed"
    if found.untouched:
        line += f", {found.untouched} untouched ({found.untouched_reason})"
    if found.truncated:
        line += "; the store held more letters than one call reads: narrow the filter"
    print(line + (" (dry run: nothing was changed)" if found.dry_run else ""), file=sys.stderr)
    return 1 if found.failed else 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    dl = sub.add_parser(
        "dead-letters", help="list, show, retry or dismiss dead letters"
    ).add_subparsers(dest="action", required=True)
    p = dl.add_parser("list", help="dead letters of every kind, newest first")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--status", choices=[s.value for s in LetterStatus], help="only this status")
    p.add_argument("--kind", choices=[k.value for k in LetterKind], help="only this kind")
    p.add_argument("--subscription", help="only letters of this subscription")
    p.add_argument("--queue", help="only commands from this queue: " + QUEUE_HELP)
    p.add_argument("--since", help="only letters created since: 90s, 30m, 2h, 7d or an ISO time")
    p.add_argument(
        "--limit", type=positive_int, help="at most this many (default: operator_page_size)"
    )
    p.set_defaults(handler=dead_letters_list)
    p = dl.add_parser("show", help="one dead letter in full, as JSON")
    p.add_argument("id", metavar="ID", help="the letter's id, as dead-letters list prints it")
    p.add_argument("--json", action="store_true", help="print JSON (this command always does)")
    p.set_defaults(handler=dead_letters_show)
    p = dl.add_parser("retry", help="deliver a letter again, or every letter a filter matches")
    _action_arguments(p)
    p.add_argument("--reason", help="why, for the audit log")
    p.set_defaults(handler=dead_letters_retry)
    p = dl.add_parser("dismiss", help="give letters up: never delivered (audited)")
    _action_arguments(p)
    p.add_argument("--reason", required=True, help="why, for the audit log")
    p.set_defaults(handler=dead_letters_dismiss)


def _action_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "id", metavar="ID", nargs="?", help="the letter's id, as dead-letters list prints it"
    )
    p.add_argument("--filter", metavar="KEY=VALUE,…", help=_FILTER)
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="with --filter: list the letters it would act on, and change nothing",
    )
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--who", help=_WHO)
