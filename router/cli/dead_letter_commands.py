"""Dead letters from the command line: list, show, retry, dismiss, over the operator service (the
same code as the HTTP API and the page)."""

from __future__ import annotations

import argparse
import sys

from consumers.runtime.dead_letters import LetterKind, LetterStatus
from router.cli.common import operator_name, positive_int, print_json
from router.operator.service import OperatorService
from router.settings import Settings
from streams.topology import QUEUE_PURPOSES

_WHO = "operator name for the audit log (default: the login name)"


def dead_letters_list(settings: Settings, args: argparse.Namespace) -> int:
    service = OperatorService(settings)
    try:
        found = service.list_dead_letters(
            status=args.status,
            kind=args.kind,
            subscription=args.subscription,
            queue=args.queue,
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
    service = OperatorService(settings)
    try:
        result = service.retry(
            args.id, who=operator_name(getattr(args, "who", None)), reason=args.reason
        )
    finally:
        service.close()
    print(f"{args.id}: {result.dead_letter.status}; {result.outcome}")
    return 0


def dead_letters_dismiss(settings: Settings, args: argparse.Namespace) -> int:
    service = OperatorService(settings)
    try:
        result = service.dismiss(
            args.id, who=operator_name(getattr(args, "who", None)), reason=args.reason
        )
    finally:
        service.close()
    print(f"{args.id}: {result.dead_letter.status}; {result.outcome}")
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    dl = sub.add_parser(
        "dead-letters", help="list, show, retry or dismiss dead letters"
    ).add_subparsers(dest="action", required=True)
    p = dl.add_parser("list", help="dead letters of every kind, newest first")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--status", choices=[s.value for s in LetterStatus], help="only this status")
    p.add_argument("--kind", choices=[k.value for k in LetterKind], help="only this kind")
    p.add_argument("--subscription", help="only letters of this subscription")
    p.add_argument("--queue", choices=QUEUE_PURPOSES, help="only commands from this queue")
    p.add_argument(
        "--limit", type=positive_int, help="at most this many (default: operator_page_size)"
    )
    p.set_defaults(handler=dead_letters_list)
    p = dl.add_parser("show", help="one dead letter in full, as JSON")
    p.add_argument("id", metavar="ID", help="the letter's id, as dead-letters list prints it")
    p.add_argument("--json", action="store_true", help="print JSON (this command always does)")
    p.set_defaults(handler=dead_letters_show)
    p = dl.add_parser("retry", help="deliver a letter again (audited)")
    p.add_argument("id", metavar="ID", help="the letter's id, as dead-letters list prints it")
    p.add_argument("--who", help=_WHO)
    p.add_argument("--reason", help="why, for the audit log")
    p.set_defaults(handler=dead_letters_retry)
    p = dl.add_parser("dismiss", help="give a letter up: it is never delivered (audited)")
    p.add_argument("id", metavar="ID", help="the letter's id, as dead-letters list prints it")
    p.add_argument("--reason", required=True, help="why, for the audit log")
    p.add_argument("--who", help=_WHO)
    p.set_defaults(handler=dead_letters_dismiss)
