"""docs/catalog.md is the catalog, written out: the page and the code cannot drift apart."""

from __future__ import annotations

import dataclasses

from streams.catalog import CATALOG, EventSpec
from streams.catalog import docs as catalog_docs
from streams.catalog.payloads import Payload


class _Refund(Payload):
    amount_cents: int


def test_the_page_is_the_catalog() -> None:
    assert catalog_docs.PAGE.read_text(encoding="utf-8") == catalog_docs.render()
    assert catalog_docs.main(["--check"]) == 0


def test_every_type_is_on_the_page_with_its_fields() -> None:
    page = catalog_docs.render()
    for spec in CATALOG.events:
        row = next(line for line in page.splitlines() if line.startswith(f"| `{spec.name}` |"))
        for field in spec.payload.model_json_schema(by_alias=True).get("properties", {}):
            assert f"`{field}`" in row, (spec.name, field)
    for command in CATALOG.commands:
        assert f"| `{command.name}` | {command.version} | `{command.queue}` |" in page


def test_a_new_type_changes_the_page() -> None:
    grown = dataclasses.replace(
        CATALOG,
        events=(*CATALOG.events, EventSpec("refund.issued", 1, _Refund, "billing", "money back")),
    )
    page = catalog_docs.render(grown)
    assert page != catalog_docs.render()
    assert "| `refund.issued` | 1 | billing | money back | `amountCents` (integer) | — |" in page
