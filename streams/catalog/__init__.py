"""The event and command catalog: types, payload models per version, upcasters (docs/catalog.md)."""

from streams.catalog.registry import CATALOG, Catalog, CommandSpec, EventSpec, Upcaster

__all__ = ["CATALOG", "Catalog", "CommandSpec", "EventSpec", "Upcaster"]
