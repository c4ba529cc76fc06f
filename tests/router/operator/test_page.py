"""The operator page in headless Chromium (Debian's ``chromium``, driven by Playwright through the
system browser's executable), on a real server over the real broker and Redis: it lists a dead
letter made by the real ``rhumbatron consume``, its retry button retries it, the list updates; and
its states: loading before the first data, an error when the API is unreachable or refuses the
token, Retry and Dismiss only where the token may act, the lag panel one row per group with its
partitions on demand. Each state's test writes a screenshot under ``.local/artifacts/``."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import BrowserContext, Page, Route, expect, sync_playwright
from pydantic import SecretStr

from consumers.redis_conn import connect
from router.operator.service import OperatorService
from router.settings import Settings
from streams.workload import slotted_events, workload
from tests.support.environment import ROOT, cleanup_environment, make_settings
from tests.support.operator import running_server, write_command_letter
from tests.support.runtime_processes import cli, publish, runtime_settings

pytestmark = pytest.mark.integration

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
# Bounds on waiting for the page (it refreshes itself every operator_refresh_s).
WAIT_MS = 30_000
ARTIFACTS = ROOT / ".local" / "artifacts"
# The key the page keeps its token under, in the tab's session storage.
TOKEN_KEY = "rhumbatron.operator.token"


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[BrowserContext]:
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"{CHROMIUM} is missing: run 'infra/local.sh browser' (make test does)")
    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"),  # a fresh user-data-dir
            executable_path=CHROMIUM,
            headless=True,
            args=CHROMIUM_ARGS,
        )
        try:
            yield context
        finally:
            context.close()


def test_the_page_lists_a_dead_letter_and_its_retry_button_retries_it(
    settings: Settings, browser: BrowserContext, tmp_path: Path
) -> None:
    s = runtime_settings(settings, operator_refresh_s=1.0)
    cli(s, "provision")
    events = slotted_events(workload("page", 1, 4), tenant_id="t")
    bad = events[2] = events[2].model_copy(
        update={"payload": {**events[2].payload, "drill": "fail"}}
    )
    publish(s, events)
    consumed = cli(s, "consume", "--subscription", "ledger", "--until-idle", "4")
    assert "1 dead-lettered" in consumed.stderr, consumed.stderr
    command, _ = write_command_letter(s, connect(s.redis_url, timeout=5), task="task-page")
    token = secrets.token_hex(16)
    auth = {"Authorization": f"Bearer {token}"}
    service = OperatorService(
        s.model_copy(
            update={
                "operator_token": SecretStr(token),
                "operator_token_name": "page-operator",
                "operator_outboxes": [str(tmp_path / "absent.sqlite")],
            }
        )
    )
    with running_server(service) as url:
        (event_letter,) = httpx.get(
            url + "api/dead-letters", params={"kind": "event-batch"}, headers=auth
        ).json()["items"]
        assert event_letter["events"] == [bad.event_id]
        page: Page = browser.new_page()
        page.goto(url)
        # Reads need a token too: the page asks for it first; the audit names its operator.
        expect(page.locator("#auth-dialog")).to_be_visible(timeout=WAIT_MS)
        page.fill("#auth-token", token)
        page.click("#auth-save")
        expect(page.locator("#whoami")).to_have_text("operator page-operator", timeout=WAIT_MS)

        row = page.locator(f'#dl-rows tr[data-id="{event_letter["id"]}"]')
        expect(row).to_be_visible(timeout=WAIT_MS)
        expect(row.locator("td.status")).to_have_text("open")
        expect(row).to_contain_text("ledger")
        expect(page.locator(f'#dl-rows tr[data-id="{command.id}"]')).to_contain_text("integration")
        expect(page.locator('#lag-rows tr.lag-group[data-subscription="ledger"]')).to_be_visible(
            timeout=WAIT_MS
        )
        expect(page.locator("#outbox-rows")).to_contain_text("absent")
        expect(page.locator("#failure-rows")).to_contain_text(event_letter["id"])

        # Retry: the token is known already, so the letter leaves the open list at once.
        row.locator("button.retry").click()
        expect(page.locator("#auth-dialog")).to_be_hidden()
        expect(row).to_have_count(0, timeout=WAIT_MS)
        expect(page.locator("#notice")).to_contain_text("redelivered to subscription ledger")
        shown = httpx.get(f"{url}api/dead-letters/{event_letter['id']}", headers=auth).json()
        assert shown["status"] == "retried" and shown["last_action"]["who"] == "page-operator"

        # The token is kept for the session: dismiss asks only for a reason.
        command_row = page.locator(f'#dl-rows tr[data-id="{command.id}"]')
        command_row.locator("button.dismiss").click()
        expect(page.locator("#auth-dialog")).to_be_hidden()
        expect(page.locator("#dismiss-dialog")).to_be_visible()
        page.fill("#dismiss-reason", "agent host decommissioned")
        page.click("#dismiss-confirm")
        expect(command_row).to_have_count(0, timeout=WAIT_MS)
        dismissed = httpx.get(f"{url}api/dead-letters/{command.id}", headers=auth).json()
        assert dismissed["status"] == "dismissed"
        assert dismissed["last_action"]["why"] == "agent host decommissioned"

        # Both are visible afterwards under their new status.
        page.select_option("#dl-status", "")
        retried_row = page.locator(f'#dl-rows tr[data-id="{event_letter["id"]}"]')
        expect(retried_row.locator("td.status")).to_have_text("retried", timeout=WAIT_MS)
        expect(retried_row).to_contain_text("page-operator")
        expect(retried_row.locator("button.retry, button.dismiss")).to_have_count(0)
    service.close()


# -- the page's states -----------------------------------------------------------------------------
@dataclass
class Letters:
    """One environment for the states: a dead letter made by ``rhumbatron consume`` (so the
    ledger's group exists, and lags by the events published after it ran) and a command letter."""

    s: Settings
    event_letter: str
    command_letter: str
    lagging: int  # events the ledger's group has not read


@pytest.fixture(scope="module")
def letters() -> Iterator[Letters]:
    s = runtime_settings(make_settings(), operator_refresh_s=1.0)
    try:
        cli(s, "provision")
        events = slotted_events(workload("states", 1, 3), tenant_id="t")
        events[1] = events[1].model_copy(update={"payload": {**events[1].payload, "drill": "fail"}})
        publish(s, events)
        consumed = cli(s, "consume", "--subscription", "ledger", "--until-idle", "4")
        assert "1 dead-lettered" in consumed.stderr, consumed.stderr
        later = slotted_events(workload("later", 1, 2), tenant_id="t")
        publish(s, later)
        command, _ = write_command_letter(s, connect(s.redis_url, timeout=5), task="task-states")
        service = OperatorService(s)
        (event,) = service.list_dead_letters(kind="event-batch").items
        service.close()
        yield Letters(s, event.id, command.id, lagging=len(later))
    finally:
        cleanup_environment(s)


READ_TOKEN = "read-" + secrets.token_hex(16)
WRITE_TOKEN = "write-" + secrets.token_hex(16)


def _server(letters: Letters, *, writable: bool) -> OperatorService:
    update: dict[str, object] = {"operator_read_token": SecretStr(READ_TOKEN)}
    if writable:
        update |= {"operator_token": SecretStr(WRITE_TOKEN), "operator_token_name": "ann"}
    return OperatorService(letters.s.model_copy(update=update))


def _signed_in(browser: BrowserContext, token: str) -> Page:
    """A page that finds ``token`` in its session storage, as after the token dialog."""
    page = browser.new_page()
    page.add_init_script(f"sessionStorage.setItem({TOKEN_KEY!r}, {token!r})")
    return page


def _shot(page: Page, state: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"page-{state}.png"), full_page=True)


def test_the_page_shows_a_loading_state_until_the_first_data_arrives(
    letters: Letters, browser: BrowserContext
) -> None:
    held: list[Route] = []
    released: list[bool] = []
    service = _server(letters, writable=True)
    with running_server(service) as url:
        page = _signed_in(browser, WRITE_TOKEN)
        # The dead letters are held back until the screenshot is taken: the page has no data.

        def hold(route: Route) -> None:
            if released:
                route.continue_()
            else:
                held.append(route)

        page.route("**/api/dead-letters*", hold)
        page.goto(url)
        expect(page.locator("body")).to_have_attribute("data-state", "loading", timeout=WAIT_MS)
        expect(page.locator("#state")).to_be_visible()
        expect(page.locator("#state")).to_contain_text("Loading")
        expect(page.locator("#dl-rows")).to_have_text("Loading…")
        # The other sections arrive meanwhile; the page stays loading until all have.
        expect(page.locator("#lag-rows tr.lag-group").first).to_be_visible(timeout=WAIT_MS)
        expect(page.locator("body")).to_have_attribute("data-state", "loading")
        assert held, "the page asked for no dead letters"
        _shot(page, "loading")
        released.append(True)
        for route in held:
            route.continue_()
        expect(page.locator("body")).to_have_attribute("data-state", "ready", timeout=WAIT_MS)
        expect(page.locator("#state")).to_be_hidden()
        expect(page.locator(f'#dl-rows tr[data-id="{letters.event_letter}"]')).to_be_visible()
        _shot(page, "ready")
    service.close()


def test_the_page_says_when_the_api_refuses_the_token_or_is_unreachable(
    letters: Letters, browser: BrowserContext
) -> None:
    service = _server(letters, writable=True)
    with running_server(service) as url:
        page = _signed_in(browser, "not-" + secrets.token_hex(16))
        page.goto(url)
        expect(page.locator("body")).to_have_attribute("data-state", "error", timeout=WAIT_MS)
        expect(page.locator("#state")).to_contain_text("The token was refused")
        expect(page.locator("#dl-rows tr[data-id]")).to_have_count(0)
        expect(page.locator("#whoami")).to_have_text("not signed in")
        _shot(page, "unauthorized")

        down = _signed_in(browser, WRITE_TOKEN)
        down.route("**/api/**", lambda route: route.abort("connectionrefused"))
        down.goto(url)
        expect(down.locator("body")).to_have_attribute("data-state", "error", timeout=WAIT_MS)
        expect(down.locator("#state")).to_contain_text("unreachable")
        _shot(down, "unreachable")
        # Once the API answers again, the page recovers by itself.
        down.unroute("**/api/**")
        expect(down.locator("body")).to_have_attribute("data-state", "ready", timeout=WAIT_MS)
        expect(down.locator(f'#dl-rows tr[data-id="{letters.command_letter}"]')).to_be_visible()
    service.close()


def test_a_read_only_server_shows_no_retry_or_dismiss(
    letters: Letters, browser: BrowserContext
) -> None:
    service = _server(letters, writable=False)
    with running_server(service) as url:
        page = _signed_in(browser, READ_TOKEN)
        page.goto(url)
        rows = page.locator("#dl-rows tr[data-id]")
        expect(rows).to_have_count(2, timeout=WAIT_MS)
        expect(page.locator("body")).to_have_attribute("data-state", "ready")
        expect(page.locator("#dl-rows button.retry, #dl-rows button.dismiss")).to_have_count(0)
        expect(page.locator("#readonly-note")).to_contain_text("Read-only")
        expect(page.locator("#whoami")).to_have_text("read token")
        _shot(page, "read-only")
    service.close()


def test_a_writable_server_shows_retry_and_dismiss_to_an_operator_only(
    letters: Letters, browser: BrowserContext
) -> None:
    service = _server(letters, writable=True)
    with running_server(service) as url:
        page = _signed_in(browser, WRITE_TOKEN)
        page.goto(url)
        event = page.locator(f'#dl-rows tr[data-id="{letters.event_letter}"]')
        command = page.locator(f'#dl-rows tr[data-id="{letters.command_letter}"]')
        expect(event.locator("button.retry")).to_be_visible(timeout=WAIT_MS)
        expect(event.locator("button.dismiss")).to_be_visible()
        expect(command.locator("button.retry")).to_be_visible()
        expect(page.locator("#whoami")).to_have_text("operator ann")
        expect(page.locator("#readonly-note")).to_be_hidden()
        _shot(page, "writable")
        # The same server, the read token: it reads, and is offered nothing to click.
        reader = _signed_in(browser, READ_TOKEN)
        reader.goto(url)
        expect(reader.locator("#dl-rows tr[data-id]")).to_have_count(2, timeout=WAIT_MS)
        expect(reader.locator("#dl-rows button.retry, #dl-rows button.dismiss")).to_have_count(0)
        expect(reader.locator("#readonly-note")).to_contain_text("read token")
    service.close()


def test_the_lag_panel_shows_groups_with_totals_and_partitions_on_demand(
    letters: Letters, browser: BrowserContext
) -> None:
    service = _server(letters, writable=False)
    partitions = len(letters.s.topology.stream_names()) * letters.s.partitions
    with running_server(service) as url:
        page = _signed_in(browser, READ_TOKEN)
        page.goto(url)
        group = page.locator('#lag-rows tr.lag-group[data-subscription="ledger"]')
        expect(group).to_be_visible(timeout=WAIT_MS)
        name = group.get_attribute("data-group")
        assert name is not None
        expect(group.locator("td.num")).to_have_text(str(letters.lagging))
        shown = page.locator(f'#lag-rows tr.lag-partition[data-group="{name}"]')
        expect(shown).to_have_count(partitions)
        for i in range(partitions):
            expect(shown.nth(i)).to_be_hidden()
        expect(group.locator("button.lag-toggle")).to_contain_text(f"{partitions} partitions")
        _shot(page, "lag-collapsed")

        group.locator("button.lag-toggle").click()
        for i in range(partitions):
            expect(shown.nth(i)).to_be_visible()
        behind = page.locator(f'#lag-rows tr.lag-partition[data-group="{name}"] td.lagging')
        expect(behind).not_to_have_count(0)
        # Expanded it stays, across the page's own refreshes.
        seen = page.locator("body").get_attribute("data-refreshes") or ""
        expect(page.locator("body")).not_to_have_attribute("data-refreshes", seen, timeout=WAIT_MS)
        expect(shown.first).to_be_visible()
        _shot(page, "lag-expanded")
        group.locator("button.lag-toggle").click()
        expect(shown.first).to_be_hidden()
    service.close()
