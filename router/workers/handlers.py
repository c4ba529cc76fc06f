"""Your code as a command handler: a plain function (or ``async def``) ``handler(command, ctx)``,
a :class:`Handlers` registry serving several command types on one queue, or a
:class:`~router.workers.model.QueueHandler` subclass — and how a worker finds it: by
``package.module:attr`` or by the name of an entry point in the group ``rhumbatron.handlers``
(the built-in drills are registered that way too).

Outcomes are typed, not flagged: returning means done; ``raise Retry(delay_s, reason)`` is a
failed attempt retried after a wait; ``raise Fail(reason)`` is permanent (dead-lettered now);
``raise MoreWork()`` asks for another delivery; any other exception is a failed attempt.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any, ClassVar

from router.imports import import_object
from router.workers.model import CommandHandler, Context, QueueHandler
from streams.envelopes import Command
from streams.errors import ConfigurationError, Fail

ENTRY_POINTS = "rhumbatron.handlers"

# What a team writes: ``handler(command, ctx)``, plain or ``async def``; its return value is
# ignored (returning means done).
HandlerFunction = Callable[[Command, Context], Any]


def _call(function: HandlerFunction, command: Command, ctx: Context) -> None:
    result = function(command, ctx)
    if inspect.isawaitable(result):
        # Each run on a loop of its own: handlers run in the worker's threads (``max_in_flight``),
        # none of which has a loop running.
        asyncio.run(_awaited(result))


async def _awaited(awaitable: Any) -> None:
    await awaitable


class Handlers(QueueHandler):
    """Several command types on one queue::

        handlers = Handlers()

        @handlers.command("agent.wake")
        async def wake(command, ctx): ...

    A command whose type has no handler fails for good (``Fail("no_handler: <type>")``): it is
    dead-lettered, never dropped."""

    name: ClassVar[str] = "handlers"

    def __init__(self) -> None:
        self._by_type: dict[str, HandlerFunction] = {}

    def command(self, command_type: str) -> Callable[[HandlerFunction], HandlerFunction]:
        if not command_type or not isinstance(command_type, str):
            raise ValueError(f"a command type is a non-empty string, got {command_type!r}")

        def register(function: HandlerFunction) -> HandlerFunction:
            if command_type in self._by_type:
                raise ValueError(f"{command_type!r} has a handler already")
            if not callable(function):
                raise TypeError(f"the handler of {command_type!r} is not callable: {function!r}")
            self._by_type[command_type] = function
            return function

        return register

    @property
    def command_types(self) -> list[str]:
        return sorted(self._by_type)

    def handle(self, command: Command, ctx: Context) -> str | None:
        function = self._by_type.get(command.command_type)
        if function is None:
            served = ", ".join(self.command_types) or "none"
            raise Fail(f"no_handler: {command.command_type} (this queue's handlers serve {served})")
        _call(function, command, ctx)
        return None


class FunctionHandler(QueueHandler):
    """A plain function (or coroutine function) as a handler."""

    def __init__(self, function: HandlerFunction, name: str) -> None:
        self.function = function
        self.name = name  # type: ignore[misc]  # per instance: the path it was loaded from

    def handle(self, command: Command, ctx: Context) -> str | None:
        _call(self.function, command, ctx)
        return None


def as_handler(target: object, name: str) -> CommandHandler:
    """What a worker runs for ``target``: a handler object as it is, a handler class made with no
    arguments, a function wrapped. Anything else is a ConfigurationError naming ``name``."""
    if isinstance(target, type):
        if not issubclass(target, QueueHandler):
            raise ConfigurationError(
                f"handler {name!r}: the class {target.__qualname__} is no QueueHandler subclass; "
                "a handler is a function handler(command, ctx), a Handlers registry or a "
                "QueueHandler subclass"
            )
        try:
            return target()
        except TypeError as exc:
            raise ConfigurationError(
                f"handler {name!r}: {target.__qualname__}() takes arguments ({exc}); a handler "
                "class must be made with none"
            ) from None
    if isinstance(target, QueueHandler):
        return target
    if callable(target) and not hasattr(target, "handle"):
        _check_signature(target, name)
        return FunctionHandler(target, name)
    if callable(getattr(target, "handle", None)):
        return target  # type: ignore[return-value]  # a CommandHandler by shape
    raise ConfigurationError(
        f"handler {name!r}: {type(target).__name__} {target!r} is not a handler; a handler is a "
        "function handler(command, ctx), a Handlers registry or a QueueHandler subclass"
    )


def _check_signature(function: Callable[..., Any], name: str) -> None:
    try:
        inspect.signature(function).bind(object(), object())
    except TypeError:
        raise ConfigurationError(
            f"handler {name!r}: {getattr(function, '__qualname__', function)!r} cannot be called "
            "as handler(command, ctx)"
        ) from None
    except ValueError:
        return  # no signature to read (a builtin): found out at the first call


def registered() -> dict[str, str]:
    """The handlers installed under the entry-point group: name -> ``module:attr``."""
    return {ep.name: ep.value for ep in entry_points(group=ENTRY_POINTS)}


def load_handler(spec: str) -> CommandHandler:
    """The handler ``spec`` names: ``package.module:attr`` (``attr`` may be dotted), or the name of
    an entry point in ``rhumbatron.handlers``. Every way it can be wrong is one
    ConfigurationError naming the spec and what was wrong."""
    spec = spec.strip()
    if not spec:
        raise ConfigurationError("handler '': name a package.module:attr or an installed handler")
    if ":" not in spec:
        found = [ep for ep in entry_points(group=ENTRY_POINTS) if ep.name == spec]
        if not found:
            known = ", ".join(sorted(registered())) or "none"
            raise ConfigurationError(
                f"handler {spec!r}: no handler of that name is installed (entry points "
                f"{ENTRY_POINTS}: {known}); or name one as package.module:attr"
            )
        path = found[0].value
    else:
        path = spec
    target = import_object(path, f"handler {spec!r}")
    return as_handler(target, spec)
