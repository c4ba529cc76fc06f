"""The operator page in headless Chromium (Debian's ``chromium``, driven by Playwright through the
system browser's executable), on a real server over the real broker and Redis: it lists a dead
letter made by the real ``rhumbatron consume``, its retry button retries it, the list updates."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import BrowserContext, Page, expect, sync_playwright
from pydantic import SecretStr

from consumers.redis_conn import connect
from router.operator.service import OperatorService
from router.settings import Settings
from streams.workload import slotted_events, workload
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
        # Reads need a token too: the page asks for it (and a name for the audit log) first.
        expect(page.locator("#auth-dialog")).to_be_visible(timeout=WAIT_MS)
        page.fill("#auth-token", token)
        page.fill("#auth-who", "page-operator")
        page.click("#auth-save")

        row = page.locator(f'#dl-rows tr[data-id="{event_letter["id"]}"]')
        expect(row).to_be_visible(timeout=WAIT_MS)
        expect(row.locator("td.status")).to_have_text("open")
        expect(row).to_contain_text("ledger")
        expect(page.locator(f'#dl-rows tr[data-id="{command.id}"]')).to_contain_text("integration")
        expect(page.locator('#lag-rows tr[data-subscription="ledger"]')).to_be_visible(
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
