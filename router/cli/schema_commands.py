"""``rhumbatron schema``: the catalog's types and versions, and any of its JSON Schemas (the
envelopes', a (type, version)'s payload's); ``rhumbatron validate``: NDJSON envelopes checked as
the router reads them — the envelope, then the payload against the catalog (docs/contract.md)."""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Iterable
from dataclasses import dataclass

import orjson

from router.cli.common import print_json
from router.settings import Settings
from streams.catalog import CATALOG
from streams.catalog.schemas import ENVELOPES, INDEX, documents, payload_file, render
from streams.envelopes import MISSING, Command, Event, decode
from streams.errors import ConfigurationError, EnvelopeError


def schema(settings: Settings, args: argparse.Namespace) -> int:
    docs = documents()
    if args.what is None:
        index = docs[INDEX]
        if args.json:
            print_json(index)
            return 0
        rows = [("event", e["type"], e["version"], "-") for e in index["events"]]
        rows += [("command", c["type"], c["version"], c["queue"]) for c in index["commands"]]
        width = max(len(name) for _, name, _, _ in rows)
        print(f"{'KIND':<8} {'TYPE':<{width}}  VERSION  QUEUE")
        for kind, name, version, queue in rows:
            print(f"{kind:<8} {name:<{width}}  {version:<7}  {queue}")
        print("the envelopes: rhumbatron schema event, rhumbatron schema command")
        return 0
    if args.what in ENVELOPES:
        sys.stdout.write(render(docs[ENVELOPES[args.what]]))
        return 0
    kind, name, version = _type_and_version(args.what)
    sys.stdout.write(render(docs[payload_file(kind, name, version)]))
    return 0


def _type_and_version(text: str) -> tuple[str, str, int]:
    """``task.completed`` (its newest version) or ``task.completed@1``: (kind, type, version)."""
    name, at, wanted = text.partition("@")
    versions = {
        "event": sorted(s.version for s in CATALOG.events if s.name == name),
        "command": sorted(s.version for s in CATALOG.commands if s.name == name),
    }
    kind = "event" if versions["event"] else "command"
    known = versions[kind]
    if not known:
        names = CATALOG.event_types() + CATALOG.command_types()
        close = difflib.get_close_matches(name, names, n=3)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise ConfigurationError(
            f"schema: {name!r} is no event or command type of the catalog{hint}; "
            "rhumbatron schema without an argument lists them"
        )
    if not at:
        return kind, name, known[-1]
    if not wanted.isdigit() or int(wanted) not in known:
        raise ConfigurationError(
            f"schema: {text!r}: {name} has version(s) {', '.join(map(str, known))}; "
            f"write {name}@<version> with one of them, or {name} for the newest"
        )
    return kind, name, int(wanted)


@dataclass(frozen=True)
class BadLine:
    """One envelope ``rhumbatron validate`` refused: its line, the wire field, and why."""

    line: int
    field: str
    reason: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.field}: {self.reason}"


def check_line(line: bytes, *, max_bytes: int) -> tuple[str, str] | None:
    """(field, reason) for an envelope line the router would refuse, or one holding a field the
    envelope does not name (which the router keeps and ignores); None when it is good."""
    try:
        parsed = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        return "<envelope>", f"not valid JSON ({exc})"
    if not isinstance(parsed, dict):
        return (
            "<envelope>",
            "must be a JSON object: an event (eventId …) or a command (commandId …)",
        )
    model: type[Event] | type[Command]
    if "eventId" in parsed:
        model = Event
    elif "commandId" in parsed:
        model = Command
    else:
        return "<envelope>", "has neither eventId (an event) nor commandId (a command)"
    try:
        envelope = decode(model, line, max_bytes=max_bytes)
        if isinstance(envelope, Event):
            CATALOG.check_payload(
                "Event", envelope.event_type, envelope.event_version, envelope.payload
            )
        else:
            # A command carries no version: it is read as its type's newest.
            spec = CATALOG.command(envelope.command_type)
            version = spec.version if spec is not None else 1
            CATALOG.check_payload("Command", envelope.command_type, version, envelope.payload)
        for name in envelope.model_extra or {}:
            # A reader keeps and ignores it (a newer writer's field), so a misspelling is lost
            # there without an error: the writer hears of it here.
            return name, (
                f"not a field of the {model.__name__} envelope: readers keep it and ignore it "
                "(docs/contract.md, forward compatibility); check its spelling against "
                f"`rhumbatron schema {model.__name__.lower()}`"
            )
    except EnvelopeError as exc:
        if exc.value is MISSING or exc.field == "<envelope>":
            return exc.field, exc.reason
        shown = repr(exc.value)
        shown = shown if len(shown) <= 120 else shown[:117] + "..."
        return exc.field, f"{exc.reason} (got {shown})"
    return None


def bad_lines(lines: Iterable[bytes], *, max_bytes: int) -> tuple[int, list[BadLine]]:
    """The envelopes read (blank lines skipped) and the bad ones among them."""
    read, bad = 0, []
    for number, line in enumerate(lines, 1):
        text = line.rstrip(b"\r\n")
        if not text.strip():
            continue
        read += 1
        found = check_line(text, max_bytes=max_bytes)
        if found is not None:
            bad.append(BadLine(number, *found))
    return read, bad


def validate(settings: Settings, args: argparse.Namespace) -> int:
    if args.file == "-":
        if not sys.stdin.readable():
            raise ConfigurationError(
                "validate -: standard input cannot be read here; pipe the NDJSON in, or name a file"
            )
        read, bad = bad_lines(sys.stdin.buffer, max_bytes=settings.max_envelope_bytes)
    else:
        try:
            with open(args.file, "rb") as source:
                read, bad = bad_lines(source, max_bytes=settings.max_envelope_bytes)
        except OSError as exc:
            raise ConfigurationError(
                f"validate: cannot read {args.file!r}: {exc.strerror or exc}; name an NDJSON "
                "file, or - for standard input"
            ) from None
    source_name = "standard input" if args.file == "-" else args.file
    if args.json:
        print_json(
            {
                "envelopes": read,
                "valid": read - len(bad),
                "invalid": [{"line": b.line, "field": b.field, "reason": b.reason} for b in bad],
            }
        )
    else:
        for line in bad:
            print(line)
    if bad:
        print(
            f"rhumbatron: {len(bad)} of {read} envelope(s) invalid in {source_name}: "
            "each is named above by its line, field and reason",
            file=sys.stderr,
        )
        return 2
    if not args.json:
        print(f"{read} envelope(s), all valid")
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "schema",
        help="the catalog's types and versions, or a JSON Schema: an envelope's or a payload's "
        "(docs/contract.md)",
    )
    p.add_argument(
        "what",
        nargs="?",
        metavar="event|command|TYPE[@VERSION]",
        help="event or command: that envelope's schema; a type (task.completed): its newest "
        "payload schema; TYPE@VERSION: that version's. Without it: every type and version",
    )
    p.add_argument("--json", action="store_true", help="the list as JSON (the catalog's index)")
    p.set_defaults(handler=schema)
    p = sub.add_parser(
        "validate",
        help="check NDJSON envelopes (events and commands) as the router reads them: a line "
        "for each bad one, exit 2 if any",
    )
    p.add_argument(
        "file",
        metavar="FILE",
        help="an NDJSON file, one envelope a line (an event has eventId, a command commandId; "
        "blank lines are skipped), or - for standard input",
    )
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(handler=validate)
