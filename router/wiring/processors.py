"""Which subscriptions an environment has, and building one's processor (docs/processors.md).

A subscription is found by its slug, in one of two places:

- an entry point of the group ``rhumbatron.subscriptions`` whose name is the slug: an installed
  package registers its own so. The product's four (``project-view-projector``,
  ``causal-router``, ``audit-archiver``, ``analytics-projector``) and the runtime's drill and test
  subscription ``ledger`` are registered in rhumbatron's own pyproject.toml, the same way;
- a ``[subscriptions.<slug>]`` table of the settings whose ``processor`` names a
  ``package.module:attr`` (or an installed subscription's name).

``rhumbatron consume --subscription package.module:attr`` also names one by its path alone.

What a path or an entry point names is a processor class (made with no arguments) or a factory
``(settings: SubscriptionSettings) -> processor`` for one that needs configuration; a factory may
also register *companions*: work that lives and dies with its consume process (the causal
router's outbox publisher and maintenance tick). ``rhumbatron consume`` starts them once the
processor is built and stops them when its loop ends; commands that only build a processor (the
operator controls, provision, acls) never start them.

Every way a subscription can be wrong — a slug the grammar refuses or that two places claim, a
path that does not import, an object that does not keep the processor contract — is one
``ConfigurationError`` naming the subscription, where it came from and what is wrong, raised
before anything joins a group.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from pydantic import BaseModel, ValidationError

from consumers.runtime.types import BaseProcessor, EffectKind, OutRecord, Processor
from router.imports import import_object
from router.settings import Settings
from streams.clock import Clock, SystemClock
from streams.errors import ConfigurationError, TopologyError
from streams.topology import check_slug, queue_name

if TYPE_CHECKING:
    import redis

ENTRY_POINTS = "rhumbatron.subscriptions"
# Keys of a [subscriptions.<slug>] table the runtime reads; every other key is the
# subscription's own, for its settings model.
PROCESSOR_KEY = "processor"
DATABASE_KEY = "database"
RESERVED = frozenset({PROCESSOR_KEY, DATABASE_KEY})

_Model = TypeVar("_Model", bound=BaseModel)
_Factory = TypeVar("_Factory", bound=Callable[..., Any])


class Companion(Protocol):
    def start(self) -> None: ...

    def close(self) -> None: ...


@dataclass
class SubscriptionSettings:
    """What a subscription's factory is given: its slug, its own settings (its
    ``[subscriptions.<slug>]`` table, read through a model it declares: :meth:`options`), and
    for the product's own subscriptions the whole settings, a Redis client and the clock."""

    slug: str
    table: Mapping[str, Any]
    settings: Settings
    clock: Clock
    _client: Callable[[], redis.Redis[bytes]] | None = field(default=None, repr=False)
    _redis: redis.Redis[bytes] | None = field(default=None, repr=False)
    companions: list[Callable[[Processor], Companion]] = field(default_factory=list, repr=False)

    @property
    def env(self) -> str:
        return self.settings.env

    @property
    def database(self) -> str | None:
        """The ``database`` key: a SQL-effect subscription's PostgreSQL URL."""
        url = self.table.get(DATABASE_KEY)
        return None if url is None else str(url)

    def options(self, model: type[_Model]) -> _Model:
        """The subscription's own keys, validated by ``model`` (a pydantic model): a wrong or
        missing key is one ConfigurationError naming ``[subscriptions.<slug>] <key>``."""
        own = {k: v for k, v in self.table.items() if k not in RESERVED}
        try:
            return model.model_validate(own)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or '(table)'}: {e['msg']}"
                for e in exc.errors()
            )
            raise ConfigurationError(f"[subscriptions.{self.slug}] {problems}") from None

    def redis(self) -> redis.Redis[bytes]:
        """The process's Redis client (made on the first ask)."""
        if self._redis is None:
            if self._client is None:
                from router.wiring.subscription import redis_client

                self._client = lambda: redis_client(self.settings)
            self._redis = self._client()
        return self._redis

    def command_record(
        self,
        command_type: str,
        project_id: str,
        *,
        command_id: str,
        now: datetime,
        payload: Mapping[str, Any] | None = None,
        queue: str | None = None,
        change_id: str | None = None,
        task_id: str | None = None,
        deadline_s: float | None = None,
    ) -> OutRecord:
        """A command as a Kafka effect: the record on ``queue`` (default: its type's queue in
        the catalog), keyed by project, its record id the command id. Every try of an event
        must make the same record: give a ``command_id`` a crash retry makes again and a
        reprocess makes anew (``"cmd_" + delivery.idempotency_key(...)``) and the event's time
        as ``now`` (the command's ``createdAt``; ``deadline_s`` counts from it). A wrong field
        raises EnvelopeError naming it."""
        from router.wiring.commands import new_command, queue_of
        from streams.envelopes import encode
        from streams.producer import command_headers

        topology = self.settings.topology
        command = new_command(
            command_type,
            project_id,
            payload=payload,
            command_id=command_id,
            change_id=change_id,
            task_id=task_id,
            deadline_s=deadline_s,
            now=now,
        )
        return OutRecord(
            topic=queue_name(queue_of(command_type, queue, topology), topology.env),
            key=project_id,
            value=encode(command, max_bytes=self.settings.max_envelope_bytes),
            record_id=command.command_id,
            headers=tuple(command_headers(command)),
        )

    def companion(self, build: Callable[[Processor], Companion]) -> None:
        """Register work that runs beside the consume loop: ``build(processor)`` is called
        once the processor is built, by ``rhumbatron consume`` only, and the companion started;
        it is closed when the loop ends."""
        self.companions.append(build)


@dataclass(frozen=True)
class Found:
    """A subscription the environment knows of: its slug, the ``package.module:attr`` that
    builds it, and where that was said (for error messages)."""

    slug: str
    path: str
    source: str


@dataclass
class Built:
    """A subscription's processor, built, and its companions (not yet made)."""

    processor: Processor
    found: Found
    settings: SubscriptionSettings

    def companions(self) -> list[Companion]:
        return [build(self.processor) for build in self.settings.companions]


def installed() -> dict[str, Found]:
    """The subscriptions installed under the entry-point group, by slug. One slug registered by
    two packages is refused, naming both."""
    found: dict[str, Found] = {}
    for ep in entry_points(group=ENTRY_POINTS):
        dist = getattr(ep, "dist", None)
        source = f"entry point {ep.name!r} of {dist.name if dist else 'an installed package'}"
        earlier = found.get(ep.name)
        if earlier is not None and earlier.path != ep.value:
            raise ConfigurationError(
                f"subscription {ep.name!r}: registered twice, as {earlier.path} "
                f"({earlier.source}) and {ep.value} ({source})"
            )
        found[ep.name] = Found(_slug(ep.name, source), ep.value, source)
    return found


def known(settings: Settings) -> dict[str, Found]:
    """Every subscription of the settings' environment, by slug: the installed ones and those
    of the settings' ``[subscriptions.<slug>]`` tables."""
    found = installed()
    for slug, table in settings.subscriptions.items():
        source = f"[subscriptions.{slug}]"
        named = table.get(PROCESSOR_KEY)
        if named is None:
            if slug not in found:
                raise ConfigurationError(
                    f"{source}: no subscription {slug!r} is installed; give its "
                    f"{PROCESSOR_KEY} = 'package.module:attr' (installed: "
                    f"{', '.join(sorted(found)) or 'none'})"
                )
            continue
        path = _path_of(str(named), found, source)
        if slug in found and found[slug].path != path:
            raise ConfigurationError(
                f"{source}: slug {slug!r} is taken by {found[slug].path} "
                f"({found[slug].source}); name your subscription otherwise"
            )
        found[slug] = Found(slug, path, source)
    return dict(sorted(found.items()))


def subscription_slugs(settings: Settings) -> list[str]:
    return list(known(settings))


def check_subscription(settings: Settings, slug: str) -> str:
    """``slug``, if the environment has that subscription; else a ConfigurationError listing
    those it has."""
    subscriptions = known(settings)
    if slug not in subscriptions:
        raise ConfigurationError(
            f"unknown subscription {slug!r}; known: {', '.join(subscriptions)} (one of your "
            "own: docs/processors.md)"
        )
    return slug


def slug_of(settings: Settings, spec: str) -> str:
    """The slug of the subscription ``spec`` names (a slug, or package.module:attr), without
    building it when the class (or a factory's ``slug`` attribute) says it."""
    spec = spec.strip()
    if ":" not in spec:
        return check_subscription(settings, spec)
    for found in known(settings).values():
        if found.path == spec:
            return found.slug
    slug = getattr(import_object(spec, f"subscription {spec!r}"), "slug", None)
    if isinstance(slug, str) and slug:
        return _slug(slug, spec)
    return load(settings, spec).found.slug


def load(
    settings: Settings,
    spec: str,
    *,
    clock: Clock | None = None,
    client: redis.Redis[bytes] | None = None,
) -> Built:
    """The processor ``spec`` names: a slug the environment knows (:func:`known`), or a
    ``package.module:attr``. Refused in one line naming the spec and the problem."""
    spec = spec.strip()
    subscriptions = known(settings)
    if ":" in spec:
        found = next(
            (f for f in subscriptions.values() if f.path == spec),
            Found("", spec, "--subscription"),
        )
    elif spec in subscriptions:
        found = subscriptions[spec]
    else:
        raise ConfigurationError(
            f"unknown subscription {spec!r}; known: {', '.join(subscriptions) or 'none'} "
            "(or name one as package.module:attr: docs/processors.md)"
        )
    where = f"subscription {found.slug or spec!r} ({found.path}, {found.source})"
    target = import_object(found.path, where)
    sub = SubscriptionSettings(
        slug=found.slug,
        table=settings.subscriptions.get(found.slug, {}) if found.slug else {},
        settings=settings,
        clock=clock or SystemClock(),
        _redis=client,
    )
    if inspect.isclass(target) and not _takes_settings(target):
        made = _made(target, where)
    elif callable(target):  # a factory, or a class made from its settings
        if not sub.slug:  # named by its path alone: the table of the slug it builds, if any
            sub.slug = getattr(target, "slug", "") or ""
            sub.table = settings.subscriptions.get(sub.slug, {})
        try:
            made = target(sub)
        except ConfigurationError:
            raise
        except Exception as exc:
            raise ConfigurationError(
                f"{where}: its factory failed: {type(exc).__name__}: {exc}"
            ) from None
    else:
        raise ConfigurationError(
            f"{where}: {type(target).__name__} is neither a processor class nor a factory "
            "(settings) -> processor"
        )
    processor = check_contract(made, where)
    if found.slug and processor.slug != found.slug:
        raise ConfigurationError(
            f"{where}: builds a processor whose slug is {processor.slug!r}, not {found.slug!r}"
        )
    if not found.slug:
        taken = subscriptions.get(processor.slug)
        if taken is not None and taken.path != found.path:
            raise ConfigurationError(
                f"{where}: slug {processor.slug!r} is taken by {taken.path} ({taken.source})"
            )
        found = Found(processor.slug, found.path, found.source)
        sub.slug = processor.slug
        sub.table = settings.subscriptions.get(processor.slug, {})
    return Built(processor, found, sub)


def build_processor(
    settings: Settings, spec: str, client: redis.Redis[bytes] | None, clock: Clock
) -> Processor:
    """:func:`load`'s processor alone (the operator controls, provision, acls)."""
    return load(settings, spec, clock=clock, client=client).processor


def check_contract(made: object, where: str) -> Processor:
    """``made``, if it keeps the processor contract (docs/processors.md); else one
    ConfigurationError saying what it lacks."""
    problems: list[str] = []
    for name in ("process", "reduce", "validate", "finish_batch"):
        if not callable(getattr(made, name, None)):
            problems.append(f"no {name}() method")
    slug = getattr(made, "slug", None)
    if not isinstance(slug, str):
        problems.append(f"slug must be a str, got {slug!r}")
    else:
        try:
            check_slug(slug)
        except TopologyError as exc:
            problems.append(str(exc))
    consumes = getattr(made, "consumes", None)
    if consumes is not None and not (
        isinstance(consumes, frozenset) and all(isinstance(t, str) for t in consumes)
    ):
        problems.append(f"consumes must be a frozenset of event types or None, got {consumes!r}")
    version = getattr(made, "reducer_version", None)
    if not isinstance(version, str):
        problems.append(f"reducer_version must be a str ('' keeps no fold), got {version!r}")
    kind = getattr(made, "effect_kind", None)
    if not isinstance(kind, EffectKind):
        kinds = ", ".join(k.name for k in EffectKind)
        problems.append(f"effect_kind must be an EffectKind ({kinds}), got {kind!r}")
    if not isinstance(getattr(made, "keeps_wire", False), bool):
        problems.append("keeps_wire must be a bool")
    if problems:
        raise ConfigurationError(f"{where}: not a processor: {'; '.join(problems)}")
    if not isinstance(made, Processor):  # what mypy is told; the checks above say why not
        raise ConfigurationError(f"{where}: not a processor")
    return made


def _takes_settings(cls: type) -> bool:
    """A class whose constructor needs one argument: it is made from its settings."""
    try:
        signature = inspect.signature(cls)
    except (TypeError, ValueError):
        return False
    try:
        signature.bind()
    except TypeError:
        try:
            signature.bind(object())
        except TypeError:
            return False
        return True
    return False


def _made(cls: type, where: str) -> object:
    if not issubclass(cls, BaseProcessor) and not all(
        hasattr(cls, name) for name in ("process", "slug", "effect_kind")
    ):
        raise ConfigurationError(
            f"{where}: {cls.__qualname__} is not a processor class (subclass rhumbatron.Processor)"
        )
    try:
        return cls()
    except Exception as exc:
        raise ConfigurationError(
            f"{where}: {cls.__qualname__}() failed: {type(exc).__name__}: {exc} (a processor "
            "that needs settings is built by a factory (settings) -> processor)"
        ) from None


def _slug(name: str, source: str) -> str:
    try:
        return check_slug(name)
    except TopologyError as exc:
        raise ConfigurationError(f"subscription {name!r} ({source}): {exc}") from None


def _path_of(named: str, found: Mapping[str, Found], source: str) -> str:
    if ":" in named:
        return named
    if named in found:
        return found[named].path
    raise ConfigurationError(
        f"{source}: {PROCESSOR_KEY} {named!r} is neither package.module:attr nor an installed "
        f"subscription ({', '.join(sorted(found)) or 'none'})"
    )


def effect_kinds(settings: Settings) -> dict[str, EffectKind]:
    """Every subscription's effect kind, by slug, for what grants and plans by kind (acls): a
    class's own; a factory's ``effect_kind`` attribute when it declares one, else its
    processor's, built (nothing is started)."""
    kinds: dict[str, EffectKind] = {}
    for slug, found in known(settings).items():
        where = f"subscription {slug!r} ({found.path}, {found.source})"
        target = import_object(found.path, where)
        kind = getattr(target, "effect_kind", None)
        if not isinstance(kind, EffectKind):
            kind = load(settings, slug).processor.effect_kind
        kinds[slug] = kind
    return kinds


def _declares(kind: EffectKind) -> Callable[[_Factory], _Factory]:
    """A factory's effect kind, said without building its processor (:func:`effect_kinds`)."""

    def declare(factory: _Factory) -> _Factory:
        factory.effect_kind = kind  # type: ignore[attr-defined]
        return factory

    return declare


# -- the product's own subscriptions, registered as entry points in pyproject.toml ---------------
@_declares(EffectKind.REDIS)
def project_view_projector(sub: SubscriptionSettings) -> Processor:
    from consumers.subscriptions.projector.processor import ProjectViewProjector

    settings = sub.settings
    return ProjectViewProjector(
        feed_length=settings.project_feed_length, missing_cap=settings.project_view_missing_cap
    )


@_declares(EffectKind.FILES)
def audit_archiver(sub: SubscriptionSettings) -> Processor:
    from router.wiring.archive import archiver

    return archiver(sub.settings)


@_declares(EffectKind.KAFKA)
def causal_router(sub: SubscriptionSettings) -> Processor:
    from router.wiring.causal import build, companion

    settings, clock = sub.settings, sub.clock
    router = build(settings, sub.redis(), clock)
    sub.companion(lambda processor: companion(settings, sub.redis(), clock, processor))
    return router


@_declares(EffectKind.KAFKA)
def analytics_projector(sub: SubscriptionSettings) -> Processor:
    from consumers.subscriptions.analytics.projector import AnalyticsProjector
    from streams.topology import metrics_topic

    return AnalyticsProjector(metrics_topic(sub.env))
