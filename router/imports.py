"""Importing what a user names as ``package.module:attr`` (a handler, a subscription's
processor): the one place such a path is read, so every way it is wrong is said the same way."""

from __future__ import annotations

import importlib

from streams.errors import ConfigurationError


def import_object(path: str, where: str) -> object:
    """The object ``path`` names (``attr`` may be dotted); every way it can be wrong is one
    ConfigurationError starting with ``where``."""
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise ConfigurationError(f"{where}: not of the form package.module:attr")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # a module that fails while importing is as wrong as a missing one
        raise ConfigurationError(
            f"{where}: cannot import {module_name!r}: {type(exc).__name__}: {exc}"
        ) from None
    target: object = module
    for part in attr.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise ConfigurationError(
                f"{where}: {module_name!r} has no attribute {attr!r}"
            ) from None
    return target
