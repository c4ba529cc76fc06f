"""Loading subscriptions: the product's own through the entry points as a team's are, one of your
own by its path, by a settings table, or through a factory with its own settings model; and every
way one can be wrong refused in one line naming it, exit 2, before anything joins a group."""

from __future__ import annotations

from importlib.metadata import EntryPoint
from typing import Any

import pytest

from consumers.runtime.types import EffectKind
from router.wiring import processors
from router.wiring.processors import (
    check_subscription,
    effect_kinds,
    installed,
    known,
    load,
    slug_of,
)
from streams.errors import ConfigurationError
from tests.support.environment import make_settings, run_cli
from tests.support.plugins import Labelled, TaskCounts, Windowed

BUILT_IN = [
    "analytics-projector",
    "audit-archiver",
    "causal-router",
    "ledger",
    "project-view-projector",
]


def test_the_products_subscriptions_are_installed_entry_points() -> None:
    found = installed()
    assert sorted(found) == BUILT_IN
    assert found["ledger"].path == "consumers.subscriptions.ledger:Ledger"
    assert all("entry point" in f.source for f in found.values())


def test_one_of_your_own_by_its_path_alone() -> None:
    s = make_settings()
    built = load(s, "tests.support.plugins:TaskCounts")
    assert isinstance(built.processor, TaskCounts)
    assert built.found.slug == "task-counts" and built.found.source == "--subscription"
    assert slug_of(s, "tests.support.plugins:TaskCounts") == "task-counts"


def test_one_of_your_own_from_a_settings_table_is_known_everywhere() -> None:
    s = make_settings(
        subscriptions={"task-counts": {"processor": "tests.support.plugins:TaskCounts"}}
    )
    assert list(known(s)) == sorted([*BUILT_IN, "task-counts"])
    assert check_subscription(s, "task-counts") == "task-counts"
    assert effect_kinds(s)["task-counts"] == EffectKind.REDIS
    assert isinstance(load(s, "task-counts").processor, TaskCounts)
    # by its path too, found as the table's
    assert load(s, "tests.support.plugins:TaskCounts").found.source == "[subscriptions.task-counts]"


def test_a_factory_reads_its_own_table_through_its_model() -> None:
    s = make_settings(
        subscriptions={
            "windowed": {"processor": "tests.support.plugins:windowed", "window": 5, "label": "w"}
        }
    )
    processor = load(s, "windowed").processor
    assert isinstance(processor, Windowed)
    assert (processor.options.window, processor.options.label) == (5, "w")


def test_a_class_whose_constructor_takes_its_settings_is_its_own_factory() -> None:
    path = "tests.support.plugins:Labelled"
    s = make_settings(subscriptions={"labelled": {"processor": path, "window": 2, "label": "seen"}})
    processor = load(s, "labelled").processor
    assert isinstance(processor, Labelled) and processor.label == "seen"


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"window": "many"}, r"\[subscriptions.windowed\] window: Input should be a valid integer"),
        ({}, r"\[subscriptions.windowed\] window: Field required"),
        ({"window": 1, "colour": "red"}, r"\[subscriptions.windowed\] colour: Extra inputs"),
    ],
)
def test_a_wrong_key_of_its_table_is_named(table: dict[str, Any], message: str) -> None:
    s = make_settings(
        subscriptions={"windowed": {"processor": "tests.support.plugins:windowed", **table}}
    )
    with pytest.raises(ConfigurationError, match=message):
        load(s, "windowed")


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("tests.support.plugins:BadSlug", "subscription slug 'Bad_Slug' is not allowed"),
        (
            "tests.support.plugins:Stolen",
            "slug 'ledger' is taken by consumers.subscriptions.ledger:Ledger",
        ),
        ("tests.support.plugins:WrongKind", "effect_kind must be an EffectKind"),
        ("tests.support.plugins:NotOne", "NotOne is not a processor class"),
        ("tests.support.plugins:Missing", "'tests.support.plugins' has no attribute 'Missing'"),
        (
            "tests.support.nowhere:Thing",
            "cannot import 'tests.support.nowhere': ModuleNotFoundError",
        ),
        ("tests.support.plugins:failing_factory", "its factory failed: RuntimeError: no database"),
        (
            "tests.support.plugins:LIST_NOT_A_FACTORY",
            "list is neither a processor class nor a factory",
        ),
        ("tests.support.plugins:", "not of the form package.module:attr"),
        (
            "no-such-subscription",
            "unknown subscription 'no-such-subscription'; known: analytics-projector",
        ),
    ],
)
def test_every_way_a_subscription_is_wrong_is_one_line_naming_it(spec: str, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message) as refused:
        load(make_settings(), spec)
    assert "\n" not in str(refused.value)


def test_a_table_naming_nothing_installed_or_claiming_an_installed_slug_is_refused() -> None:
    with pytest.raises(ConfigurationError, match=r"\[subscriptions.mine\]: no subscription 'mine'"):
        known(make_settings(subscriptions={"mine": {"window": 3}}))
    with pytest.raises(ConfigurationError, match=r"slug 'ledger' is taken by consumers"):
        known(
            make_settings(
                subscriptions={"ledger": {"processor": "tests.support.plugins:TaskCounts"}}
            )
        )
    with pytest.raises(ConfigurationError, match="builds a processor whose slug is 'task-counts'"):
        load(
            make_settings(
                subscriptions={"other": {"processor": "tests.support.plugins:TaskCounts"}}
            ),
            "other",
        )


def test_one_slug_registered_by_two_packages_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    group = processors.ENTRY_POINTS
    twice = [
        EntryPoint("counts", "one.module:Counts", group),
        EntryPoint("counts", "two.module:Counts", group),
    ]
    monkeypatch.setattr(processors, "entry_points", lambda group: twice)
    with pytest.raises(
        ConfigurationError, match="'counts': registered twice, as one.module:Counts"
    ):
        installed()


def test_consume_refuses_a_broken_processor_in_one_line_before_joining() -> None:
    # No broker is asked: the settings point nowhere, and the refusal comes first.
    s = make_settings(kafka_bootstrap="127.0.0.1:1")
    result = run_cli(s, "consume", "--subscription", "tests.support.plugins:BadSlug", timeout=60)
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "subscription slug 'Bad_Slug' is not allowed" in lines[0], lines


@pytest.mark.parametrize(
    "spec",
    [
        "ledger",
        "project-view-projector",
        "tests.support.plugins:TaskCounts",
        "windowed",
        "labelled",
    ],
)
def test_built_ins_and_plug_ins_load_and_pass_the_same_exactly_once_check(spec: str) -> None:
    from rhumbatron.testing import assert_exactly_once, event

    s = make_settings(
        subscriptions={
            "windowed": {"processor": "tests.support.plugins:windowed", "window": 2},
            "labelled": {"processor": "tests.support.plugins:Labelled", "window": 2},
        }
    )
    events = [
        event(kind, project, slot=n, task_id=f"t{n}", payload={"agentId": "agent-1"})
        for n, kind in enumerate(("task.created", "task.started", "task.completed"), start=1)
        for project in ("a", "b", "c")
    ]
    clean = assert_exactly_once(lambda: load(s, spec).processor, events, random_shapes=10)
    assert clean.applied, spec
