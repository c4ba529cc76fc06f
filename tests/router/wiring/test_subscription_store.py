"""The store a subscription commits through, by its effect kind (router.wiring.subscription
``store_for``): a SQL-effect processor's own PostgreSQL from ``[subscriptions.<slug>] database``,
for its runner and for the operator's controls; Redis for every other kind; a missing, unusable
or unprovisioned database refused in one line that says where it goes and what to run."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from consumers.runtime.redis_store import RedisStore
from consumers.runtime.sql_store import SqlStore
from consumers.runtime.types import TP
from consumers.subscriptions.ledger import Ledger
from router.wiring.subscription import controls, sql_database, store_for
from streams.clock import ManualClock
from streams.errors import ConfigurationError
from tests.support.environment import make_settings
from tests.support.postgres import FreshSchema
from tests.support.sql_effects import SqlDatabase, TaskHistory

SLUG = TaskHistory.slug
CLIENT = redis.Redis()  # never asked anything here: the stores connect on first use


@pytest.fixture
def db() -> Iterator[SqlDatabase]:
    database = SqlDatabase()
    yield database
    database.drop()


def test_other_effect_kinds_keep_the_redis_store() -> None:
    assert isinstance(store_for(make_settings(), Ledger(), CLIENT, ManualClock()), RedisStore)


@pytest.mark.parametrize(
    ("table", "said"),
    [
        ({}, "got nothing"),
        ({"database": ""}, "got ''"),
        ({"database": 5432}, "got 5432"),
        ({"database": "postgresql://u:secret@h/db?bogus=1"}, "is not a PostgreSQL URL"),
    ],
)
def test_a_missing_or_unusable_database_is_one_line_naming_where_it_goes(
    table: dict[str, object], said: str
) -> None:
    settings = make_settings(subscriptions={SLUG: table})
    with pytest.raises(ConfigurationError) as refused:
        store_for(settings, TaskHistory("e"), CLIENT, ManualClock())
    message = str(refused.value)
    assert message.startswith(f"[subscriptions.{SLUG}] database")
    assert "RHUMBATRON_SUBSCRIPTIONS__TASK_HISTORY__DATABASE" in message and said in message
    assert "secret" not in message and "\n" not in message


@pytest.mark.integration
def test_a_sql_processor_commits_through_its_own_database_and_so_do_its_controls(
    db: SqlDatabase,
) -> None:
    settings = make_settings(subscriptions={SLUG: {"database": db.url}})
    assert sql_database(settings, SLUG) == db.url
    proc = TaskHistory(settings.env)
    store = store_for(settings, proc, CLIENT, ManualClock())
    assert isinstance(store, SqlStore) and store.env == settings.env and store.slug == SLUG
    tp = TP("s", 0)
    assert store.acquire(tp) == 1
    operator = controls(settings, proc, CLIENT, ManualClock())
    assert isinstance(operator.store, SqlStore) and operator.store.epoch(tp) == 1
    store.close()
    operator.store.close()


@pytest.mark.integration
def test_an_unprovisioned_database_says_to_run_provision() -> None:
    bare = FreshSchema(init=False)
    try:
        settings = make_settings(subscriptions={SLUG: {"database": bare.url}})
        with pytest.raises(ConfigurationError, match="run `rhumbatron provision`"):
            store_for(settings, TaskHistory(settings.env), CLIENT, ManualClock())
    finally:
        bare.drop()


@pytest.mark.integration
def test_provision_makes_the_tables_in_a_sql_subscriptions_database() -> None:
    from router.wiring.provisioning import provision_databases

    bare = FreshSchema(init=False)
    try:
        table = {"processor": "tests.support.plugins:Notes", "database": bare.url}
        settings = make_settings(subscriptions={"notes": table})
        [line] = provision_databases(settings)
        assert line.startswith("notes: its tables in postgresql://") and "***" in line
        assert provision_databases(settings) == [line]  # idempotent
        from tests.support.plugins import Notes

        store = store_for(settings, Notes(), CLIENT, ManualClock())
        assert isinstance(store, SqlStore)
        store.close()
    finally:
        bare.drop()
