"""Which version of an event a subscription's code sees.

A processor is written against the newest version of each event type its code knows (the
catalog it was built with, ``RuntimePolicy.catalog``); the log holds every version ever written.
So every path that decodes an event for a processor — live delivery, an operator's redelivery
of a dead letter (it comes back through the same runner), a refold, a reprocess, a first fold
from the archive — hands it the event upcast by the catalog's chain of pure functions, and a
fold rebuilt from the log equals the one built live, whatever versions the log mixes.

The exception is a processor that writes the envelope on whole (``keeps_wire``: the
audit-archiver): it sees each event as written, its version and every field it came with, so the
archive keeps history as it happened and the wire bytes it is handed are the event it is given.
"""

from __future__ import annotations

from typing import Protocol

from consumers.runtime.types import Processor
from streams.catalog import Catalog
from streams.envelopes import Event


class KnowsCatalog(Protocol):
    """What carries the catalog a subscription's code knows: its ``RuntimePolicy``, its
    ``Controls``."""

    @property
    def catalog(self) -> Catalog: ...


def reads_as_written(processor: Processor) -> bool:
    """Whether ``processor`` is handed events as written (not upcast): one that keeps the wire
    bytes, whose event must be what those bytes say."""
    return processor.keeps_wire


def upcast_for(known: KnowsCatalog, event: Event) -> Event:
    """``event`` as the newest version of its type ``known.catalog`` holds; unchanged when it is
    that version already, of a type not cataloged, or newer than the catalog knows (such an event
    is the caller's to refuse or park)."""
    return known.catalog.upcast(event)
