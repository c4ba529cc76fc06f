"""One error tree: every exception class of the project lives in streams.errors, under one of its
two roots, and the module docstring draws all of them."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from types import ModuleType

import pytest

import consumers
import router
import streams
from streams import errors
from streams.errors import InternalSignal, RhumbatronError, SimulatedCrash

PACKAGES = (streams, consumers, router)


def _modules() -> list[ModuleType]:
    found: list[ModuleType] = []
    for package in PACKAGES:
        found.append(package)
        for info in pkgutil.walk_packages(package.__path__, prefix=package.__name__ + "."):
            if info.name.endswith(".__main__"):  # importing it runs the command line
                continue
            try:
                found.append(importlib.import_module(info.name))
            except ModuleNotFoundError as exc:
                # Only an optional third-party extra may be missing; one of ours is a bug.
                if exc.name is None or exc.name.split(".")[0] in {p.__name__ for p in PACKAGES}:
                    raise
    return found


def _exception_classes() -> dict[str, type[BaseException]]:
    """Every exception class defined (not merely imported) in our modules, by qualified name."""
    found: dict[str, type[BaseException]] = {}
    for module in _modules():
        for _, value in inspect.getmembers(module, inspect.isclass):
            if issubclass(value, BaseException) and value.__module__.split(".")[0] in {
                p.__name__ for p in PACKAGES
            }:
                found[f"{value.__module__}.{value.__qualname__}"] = value
    return found


def test_every_exception_class_is_defined_in_streams_errors() -> None:
    elsewhere = sorted(
        name for name, cls in _exception_classes().items() if cls.__module__ != errors.__name__
    )
    assert not elsewhere, f"define these in streams/errors.py: {elsewhere}"


def test_every_exception_class_is_an_error_or_a_signal_and_never_both() -> None:
    classes = _exception_classes()
    assert len(classes) > 40  # the walk found the project, not an empty package
    for name, cls in classes.items():
        if cls in (RhumbatronError, InternalSignal):
            continue
        if cls is SimulatedCrash:  # the harness's process death: under neither root, on purpose
            assert not issubclass(cls, Exception)
            continue
        assert issubclass(cls, RhumbatronError) != issubclass(cls, InternalSignal), name


def test_the_two_roots_are_apart() -> None:
    assert not issubclass(RhumbatronError, InternalSignal)
    assert not issubclass(InternalSignal, RhumbatronError)


@pytest.mark.parametrize(
    "name",
    sorted(
        name
        for name, value in vars(errors).items()
        if inspect.isclass(value) and value.__module__ == errors.__name__
    ),
)
def test_the_module_docstring_draws_every_class(name: str) -> None:
    assert errors.__doc__ is not None
    assert re.search(rf"\b{name}\b", errors.__doc__), f"streams/errors.py's tree lacks {name}"
