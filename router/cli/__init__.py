"""The ``rhumbatron`` command line: one module per area of commands, each a thin shell over the
code in ``router/wiring`` and below. Nothing outside this package imports it."""

from router.cli.main import main

__all__ = ["main"]
