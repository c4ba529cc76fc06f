"""docs/catalog.md, written from the catalog: the page a writer in any language reads.

``python -m streams.catalog.docs --write`` writes it; ``--check`` (run by ``make check``) fails
when the page and the catalog disagree, so the page can never drift from the code.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from streams.catalog.payloads import Payload
from streams.catalog.registry import CATALOG, Catalog

PAGE = Path(__file__).resolve().parents[2] / "docs" / "catalog.md"

_INTRO = """\
# The event and command catalog

Every event type the platform defines, who writes it, what its payload holds and what the causal
router does with it; every command type, who sends it and the queue it goes to. This page is
written from the code (`streams/catalog/`), and `make check` fails when the two differ. The same
models are published as JSON Schemas in `schemas/` (docs/contract.md says how to use them from
another language), and `rhumbatron schema TYPE` prints one.

A payload is a JSON object. The fields below are checked where an event is written (the
outbox's INSERT and the Python writers) and where a consumer reads it; a field not listed is
kept and ignored, so a writer may add one. A field marked *optional* may be left out or `null`.
Text is a string of 1 to 1,000 characters with at least one that is not white space.

Every event also carries the envelope (`eventId`, `eventType`, `eventVersion`, `tenantId`,
`projectId`, `changeId`, `taskId`, `actor`, `resource`, `canonicalGeneration`, `causedBy`,
`correlationId`, `timestamp`, and the `slot` the outbox gives it); every command `commandId`,
`commandType`, `projectId`, `changeId`, `taskId`, `attempt`, `createdAt`, `deadline`. The
envelope schemas are `schemas/event.schema.json` and `schemas/command.schema.json`.
"""


_NOTES = """\
Rules that span the payload and the envelope (checked by the consumers that need them):

- `intent.declared`, `challenge.raised`, `changeset.proposed`, `claim.acquired`: the paths are
  `resources`, or the envelope's `resource` when the payload has none; the router needs at
  least one, and at most `router_max_resources_per_event` (docs/router.md).
- `artifact.promoted`, `canonical.advanced`, `release.completed`: `generation` may be left out
  when the envelope's `canonicalGeneration` carries it; `canonical.advanced` needs one of the two,
  and they must agree (docs/events.md).
- `task.failed` with a `blockedLimit` is a blocking failure: the task shows as `blocked`
  (docs/events.md, "Blocked, then failed").
"""


def _type(prop: dict[str, Any]) -> str:
    choices = [c for c in prop.get("anyOf", [prop]) if c.get("type") != "null"]
    if len(choices) != 1:
        return " or ".join(_type(c) for c in choices)
    one = choices[0]
    kind = one.get("type")
    if kind == "array":
        return f"list of {_type(one.get('items', {}))}"
    if kind == "string":
        return "text"
    if kind == "integer" and one.get("minimum") == 0:
        return "integer ≥ 0"
    return str(kind)


def _fields(model: type[Payload]) -> str:
    schema = model.model_json_schema(by_alias=True)
    required = set(schema.get("required", ()))
    parts = []
    for name, prop in schema.get("properties", {}).items():
        mark = "" if name in required else ", optional"
        parts.append(f"`{name}` ({_type(prop)}{mark})")
    return "; ".join(parts) or "—"


def _versions(catalog: Catalog) -> str:
    newer = sorted(
        f"`{name}` (up to {catalog.latest(name)})"
        for name in catalog.event_types()
        if catalog.latest(name) > 1
    )
    if not newer:
        return "Every event type above is at version 1."
    return "Event types past version 1: " + ", ".join(newer) + "; every other is at version 1."


def render(catalog: Catalog = CATALOG) -> str:
    lines = [_INTRO, "## Events", ""]
    lines.append("| type | version | written by | means | payload | router sends |")
    lines.append("|---|---|---|---|---|---|")
    for spec in sorted(catalog.events, key=lambda s: (s.name, s.version)):
        causes = ", ".join(f"`{c}`" for c in spec.causes) or "—"
        lines.append(
            f"| `{spec.name}` | {spec.version} | {spec.producer} | {spec.meaning} "
            f"| {_fields(spec.payload)} | {causes} |"
        )
    lines += ["", _NOTES]
    lines += ["## Commands", ""]
    lines.append("| type | version | queue | sent by | asks for | payload |")
    lines.append("|---|---|---|---|---|---|")
    for command in sorted(catalog.commands, key=lambda s: (s.name, s.version)):
        lines.append(
            f"| `{command.name}` | {command.version} | `{command.queue}` | {command.producer} "
            f"| {command.meaning} | {_fields(command.payload)} |"
        )
    lines += [
        "",
        "A queue `q` is the topic `rhumbatron-q-<env>` (docs/queues.md). Command ids are stable,",
        "derived from what caused the command (docs/router.md), so a redelivered event can only",
        "send the same command again.",
        "",
        "## Versions",
        "",
        _versions(catalog),
        "A payload changes within its version only by gaining optional fields; any other change",
        'is a new version with an upcaster from the one before (docs/contract.md, "Versions and',
        'forward compatibility").',
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="write docs/catalog.md")
    mode.add_argument("--check", action="store_true", help="fail when docs/catalog.md differs")
    args = parser.parse_args(argv)
    text = render()
    if args.write:
        PAGE.write_text(text, encoding="utf-8")
        return 0
    if not PAGE.exists() or PAGE.read_text(encoding="utf-8") != text:
        print(
            f"{PAGE.relative_to(PAGE.parents[1])} differs from the catalog (streams/catalog/): "
            "run `.venv/bin/python -m streams.catalog.docs --write`",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
