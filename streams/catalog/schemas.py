"""The catalog as JSON Schema (2020-12) documents, for writers and readers in any language.

:func:`documents` builds them from the models: the two envelopes (``Event``, ``Command``), the
payload of every cataloged (type, version), and ``catalog.json``, the index of them all. The files
under ``schemas/`` are those documents, written by ``--write``; ``--check`` (run by ``make
check``) fails when the files and the models disagree, or when a schema changed in a way the
compatibility rule (:mod:`streams.catalog.compat`, docs/contract.md) forbids:

- against every earlier committed state of its own file (git history: the files are the
  registry), within a (type, version) only optional fields may be gained;
- version n of a type reads everything written at every version m < n, unless an upcaster chain
  carries m to n.

    python -m streams.catalog.schemas --check [--no-history]
    python -m streams.catalog.schemas --write
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import GenerateJsonSchema

from streams import envelopes
from streams.catalog import compat
from streams.catalog.registry import CATALOG, Catalog, CommandSpec, EventSpec

# Identifiers, never fetched: a document names itself and nothing resolves them over the network.
BASE_ID = "https://rhumbatron.dev/schemas/"
FOLDER = "schemas"
INDEX = "catalog.json"
ENVELOPES = {"event": "event.schema.json", "command": "command.schema.json"}
KIND_FOLDER = {"event": "events", "command": "commands"}

Document = dict[str, Any]


class _WithoutFieldTitles(GenerateJsonSchema):
    """pydantic titles each field after its Python name ("Agentid"): noise beside the wire name."""

    def field_title_should_be_set(self, schema: Any) -> bool:
        return False


def payload_file(kind: str, name: str, version: int) -> str:
    """The payload schema's file, relative to ``schemas/``: ``events/task.completed.v1.schema.json``."""
    return f"{KIND_FOLDER[kind]}/{name}.v{version}.schema.json"


def _payload_id(kind: str, name: str, version: int) -> str:
    return f"{BASE_ID}{KIND_FOLDER[kind]}/{name}/{version}.json"


def _model_schema(model: type[BaseModel]) -> Document:
    return model.model_json_schema(by_alias=True, schema_generator=_WithoutFieldTitles)


def envelope_schema(kind: str) -> Document:
    """The envelope's document. Open at the top level (a reader tolerates an envelope field it
    does not know, so a newer writer may add one); the payload is any object, its own document
    being the (type, version)'s."""
    model = envelopes.Event if kind == "event" else envelopes.Command
    schema = _model_schema(model)
    schema["additionalProperties"] = True
    folder = KIND_FOLDER[kind]
    schema["properties"]["payload"] = {
        "type": "object",
        "description": f"the payload of the {kind}'s type (and version): its document is "
        f"{folder}/<type>.v<version>.schema.json, listed in {INDEX}",
    }
    for name, prop in schema["properties"].items():
        schema["properties"][name] = _timestamp(prop)
    return {
        "$schema": compat.DIALECT,
        "$id": f"{BASE_ID}{kind}.json",
        **schema,
        "title": f"Rhumbatron {kind} envelope",
    }


def _timestamp(schema: Document) -> Document:
    """A time's schema says the one form the envelopes read (UTC, milliseconds, a Z)."""
    if schema.get("format") == "date-time":
        # The decoder's own expression: the wire form is that and only that.
        return {**schema, "pattern": envelopes._TIME_FORMAT.pattern}
    if "anyOf" in schema:
        return {**schema, "anyOf": [_timestamp(branch) for branch in schema["anyOf"]]}
    return schema


def payload_schema(kind: str, spec: EventSpec | CommandSpec) -> Document:
    """The document of one (type, version)'s payload: open (a field it does not name is kept and
    ignored), every named field as strict as the model."""
    schema = _model_schema(spec.payload)
    schema["additionalProperties"] = True
    said = [f"{spec.meaning[:1].upper()}{spec.meaning[1:]}. Written by: {spec.producer}."]
    if isinstance(spec, EventSpec) and spec.causes:
        said.append(f"The causal router sends {', '.join(spec.causes)} for it.")
    if isinstance(spec, CommandSpec):
        said.append(f"Carried on the {spec.queue} queue.")
    if schema.get("description"):
        said.append(schema["description"])
    return {
        "$schema": compat.DIALECT,
        "$id": _payload_id(kind, spec.name, spec.version),
        **schema,
        "title": f"{spec.name} {kind} payload, version {spec.version}",
        "description": " ".join(said),
    }


def _specs(catalog: Catalog) -> Iterable[tuple[str, EventSpec | CommandSpec]]:
    for spec in sorted(catalog.events, key=lambda s: (s.name, s.version)):
        yield "event", spec
    for command in sorted(catalog.commands, key=lambda s: (s.name, s.version)):
        yield "command", command


def documents(catalog: Catalog = CATALOG) -> dict[str, Document]:
    """Every document, by its file relative to ``schemas/``."""
    out: dict[str, Document] = {file: envelope_schema(kind) for kind, file in ENVELOPES.items()}
    index: Document = {
        "$comment": "Generated from the catalog: python -m streams.catalog.schemas --write",
        "envelopes": {
            kind: {"file": file, "$id": out[file]["$id"]} for kind, file in ENVELOPES.items()
        },
        "events": [],
        "commands": [],
    }
    for kind, spec in _specs(catalog):
        file = payload_file(kind, spec.name, spec.version)
        out[file] = payload_schema(kind, spec)
        entry: Document = {
            "type": spec.name,
            "version": spec.version,
            "file": file,
            "$id": out[file]["$id"],
            "producer": spec.producer,
            "meaning": spec.meaning,
        }
        if isinstance(spec, EventSpec):
            entry["causes"] = list(spec.causes)
            index["events"].append(entry)
        else:
            entry["queue"] = spec.queue
            index["commands"].append(entry)
    out[INDEX] = index
    return out


def render(document: Document) -> str:
    """The file's text: keys sorted, two-space indents, a newline at the end."""
    return json.dumps(document, indent=2, sort_keys=True) + "\n"


# -- the files against the models ----------------------------------------------------------------


def _published(folder: Path) -> list[str]:
    """The payload documents in the folder, by name relative to it."""
    return sorted(
        str(path.relative_to(folder))
        for sub in KIND_FOLDER.values()
        for path in (folder / sub).glob("*.schema.json")
    )


def differences(folder: Path, docs: Mapping[str, Document]) -> list[str]:
    """What in ``folder`` (the ``schemas/`` folder) is not what the models say."""
    problems = []
    for file, document in docs.items():
        path = folder / file
        if not path.is_file():
            problems.append(f"{path}: missing")
        elif path.read_text() != render(document):
            problems.append(f"{path}: not what the models say")
    for file in _published(folder):
        if file not in docs:
            problems.append(f"{folder / file}: no such (type, version) in the catalog")
    return problems


def write(folder: Path, docs: Mapping[str, Document]) -> list[str]:
    """Write every document; remove payload documents the catalog no longer has. The lines to
    print: each file changed."""
    changed = []
    for file, document in docs.items():
        path = folder / file
        path.parent.mkdir(parents=True, exist_ok=True)
        text = render(document)
        if not path.is_file() or path.read_text() != text:
            path.write_text(text)
            changed.append(f"wrote {path}")
    for file in _published(folder):
        if file not in docs:
            (folder / file).unlink()
            changed.append(f"removed {folder / file}")
    return changed


# -- the compatibility rule against history and across versions ----------------------------------


@dataclass
class History:
    """Every committed state of the schema files, by file (relative to ``schemas/``), newest
    first; ``unavailable`` says why there is none to read (then the check fails closed)."""

    states: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    unavailable: str | None = None


def _git(root: Path, *args: str, feed: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        ["git", "-C", str(root), *args], input=feed, capture_output=True, check=False
    )


def read_history(root: Path) -> History:
    """The committed states of ``root``'s schema documents (``root`` holds ``schemas/``): one
    ``git log`` and one ``git cat-file --batch`` for them all."""
    try:
        found = _git(root, "rev-parse", "--is-shallow-repository", "--show-prefix")
    except FileNotFoundError:
        return History(unavailable="git is not installed")
    if found.returncode != 0:
        said = found.stderr.decode(errors="replace").strip()
        return History(unavailable=f"{root} is not in a git repository ({said})")
    shallow, prefix = (found.stdout.decode().splitlines() + ["", ""])[:2]
    if shallow == "true":
        return History(
            unavailable="the clone is shallow, so earlier states of the schemas may be missing "
            "(git fetch --unshallow)"
        )
    tracked = [f"{FOLDER}/{KIND_FOLDER[k]}" for k in KIND_FOLDER]
    tracked += [f"{FOLDER}/{file}" for file in ENVELOPES.values()]
    log = _git(root, "log", "--format=%x00%H", "--name-only", "--relative", "--", *tracked)
    if log.returncode != 0:
        return History(unavailable=f"git log failed: {log.stderr.decode(errors='replace')}")
    wanted: list[tuple[str, str]] = []
    for chunk in log.stdout.decode().split("\0")[1:]:
        sha, *files = chunk.split()
        wanted += [(sha, file) for file in files if file.startswith(f"{FOLDER}/")]
    feed = "".join(f"{sha}:{prefix}{file}\n" for sha, file in wanted).encode()
    batch = _git(root, "cat-file", "--batch", feed=feed)
    history = History()
    out, at = batch.stdout, 0
    for sha, file in wanted:
        end = out.index(b"\n", at)
        header = out[at:end].split()
        at = end + 1
        if header[-1] == b"missing":
            continue  # the commit deleted the file: its states before are read from theirs
        size = int(header[2])
        text = out[at : at + size].decode()
        at += size + 1
        history.states.setdefault(file.removeprefix(f"{FOLDER}/"), []).append((sha, text))
    return history


def history_problems(history: History, docs: Mapping[str, Document]) -> list[str]:
    """Each document against every committed state of its file: the within-version rule."""
    problems = []
    for file, states in sorted(history.states.items()):
        if file not in docs:
            sha = states[0][0][:10]
            problems.append(
                f"{FOLDER}/{file}: published (commit {sha}), and now gone: data of that "
                "(type, version) exists, so it stays in the catalog"
            )
            continue
        now = render(docs[file])
        for sha, text in states:
            if text == now:
                continue
            try:
                then = json.loads(text)
            except json.JSONDecodeError as exc:
                problems.append(f"{FOLDER}/{file} at {sha[:10]}: not JSON ({exc}): cannot compare")
                continue
            found = compat.same_version(
                then, docs[file], old_name=f"its state at {sha[:10]}", new_name="the models' schema"
            )
            problems += [f"{FOLDER}/{file}: {problem}" for problem in found]
    return problems


def version_problems(docs: Mapping[str, Document], catalog: Catalog = CATALOG) -> list[str]:
    """Version n of each type against every version m < n: backward compatible, or an upcaster
    chain from m to n (event types only; a command is read as the version it was sent at)."""
    problems = []
    for kind, specs in (("event", catalog.events), ("command", catalog.commands)):
        newest: dict[str, int] = {}
        for spec in specs:
            newest[spec.name] = max(newest.get(spec.name, 0), spec.version)
        for name, last in sorted(newest.items()):
            for n in range(2, last + 1):
                for m in range(1, n):
                    chain = all((name, k) in catalog.upcasters for k in range(m, n))
                    if kind == "event" and chain:
                        continue
                    found = compat.new_version(
                        docs[payload_file(kind, name, m)],
                        docs[payload_file(kind, name, n)],
                        earlier_name=f"version {m}",
                        later_name=f"version {n}",
                    )
                    problems += [f"{kind} {name}@{n} reading @{m}: {p}" for p in found]
    return problems


def check(root: Path, *, use_history: bool, catalog: Catalog = CATALOG) -> list[str]:
    """Every problem ``--check`` reports for the checkout at ``root``; empty when all is well."""
    docs = documents(catalog)
    problems = differences(root / FOLDER, docs)
    if problems:
        problems.append(f"run {_WRITE} to write what the models say")
    problems += version_problems(docs, catalog)
    if use_history:
        history = read_history(root)
        if history.unavailable is not None:
            problems.append(
                f"the schemas' history cannot be read: {history.unavailable}; without it "
                "the compatibility rule cannot be checked (--no-history skips it, knowingly)"
            )
        problems += history_problems(history, docs)
    return problems


_WRITE = "python -m streams.catalog.schemas --write"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m streams.catalog.schemas",
        description="Write or check the catalog's JSON Schemas in schemas/ (docs/contract.md).",
    )
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--check", action="store_true", help="fail when files or history disagree")
    action.add_argument("--write", action="store_true", help="write the files from the models")
    parser.add_argument(
        "--no-history",
        action="store_true",
        help="skip the comparison with the files' committed states (where git has none)",
    )
    parser.add_argument(
        "--root", type=Path, default=Path.cwd(), help="the checkout (default: here)"
    )
    args = parser.parse_args(argv)
    if args.write:
        for line in write(args.root / FOLDER, documents()):
            print(line)
        return 0
    problems = check(args.root, use_history=not args.no_history)
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        print(f"schemas: {len(problems)} problem(s)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
