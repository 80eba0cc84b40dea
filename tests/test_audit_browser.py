"""The audit log in headless Chromium against the live server: a real tool call whose command carries markup is shown
as text (no element, no script), the call list filters by tool, the CSV export downloads, the overview draws bars."""

from __future__ import annotations

import csv
import io
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import anyio
import pytest
from playwright.sync_api import Browser, Dialog, Page

from tests.browser import log_in_as_admin
from tests.live import LiveServer, mcp_client, poll, running_server, text_of

pytestmark = [pytest.mark.live, pytest.mark.browser]
MARKUP = "<img src=x onerror=alert(1)>"
PAGE_DEADLINE = 15.0


@pytest.fixture(scope="module")
def live_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """A server of this module's own: the overview ranks the busiest tools and credentials, which on the session's
    shared server depends on what the modules that ran before this one called."""
    with running_server(tmp_path_factory.mktemp("audit-browser")) as server:
        yield server


@pytest.fixture
def dialogs() -> list[str]:
    return []


@pytest.fixture
def admin_page(browser: Browser, live_server: LiveServer, dialogs: list[str]) -> Iterator[Page]:
    """A logged-in admin page that records (and dismisses) every JavaScript dialog any page opens."""
    context = browser.new_context(accept_downloads=True)
    page = context.new_page()

    def record(dialog: Dialog) -> None:
        dialogs.append(dialog.message)
        dialog.dismiss()

    page.on("dialog", record)
    log_in_as_admin(page, live_server)
    yield page
    context.close()


@pytest.fixture(scope="module")
def markup_call(live_server: LiveServer) -> tuple[str, str]:
    """A terminal_exec call, through the MCP client with a token of its own, whose command carries an <img> tag.
    Returns the marker that names the call and the token's name."""
    marker = uuid.uuid4().hex[:12]
    token_name = f"audit-browser-{marker}"
    token = live_server.create_token(token_name)

    async def call() -> str:
        async with mcp_client(live_server.mcp_url, token) as client:
            result = await client.call_tool("terminal_exec", {"command": f"echo '{MARKUP}' {marker}"})
            return text_of(result)

    # Playwright's sync API runs an event loop in this thread once the browser is up: the client gets a thread of its own.
    with ThreadPoolExecutor(max_workers=1) as pool:
        assert MARKUP in pool.submit(anyio.run, call).result(timeout=120)
    return marker, token_name


def open_call_list_filtered_by_tool(page: Page, server: LiveServer, tool: str) -> None:
    page.goto(f"{server.url}/admin/audit/auditrecord/")
    page.click("#audit-menu-tool > summary")  # the filter bar's tool menu
    page.locator("#audit-menu-tool").get_by_label(tool, exact=True).check()
    page.locator("#audit-menu-tool").get_by_role("button", name="Apply").click()
    page.wait_for_url(lambda url: url.endswith(f"/admin/audit/auditrecord/?tool={tool}"))


def finished_row_with(page: Page, marker: str) -> object:
    """The row of the call with `marker`, once its outcome is in (reloading until then)."""
    row = page.locator("#result_list tbody tr", has_text=marker)
    if row.count() == 1 and row.locator("td.field-call_outcome").inner_text() != "running":
        return row
    page.reload()
    return None


def test_a_command_carrying_markup_is_shown_as_text_and_runs_nothing(
    admin_page: Page, live_server: LiveServer, markup_call: tuple[str, str], dialogs: list[str]
) -> None:
    marker, token_name = markup_call
    page = admin_page
    open_call_list_filtered_by_tool(page, live_server, "terminal_exec")
    poll(lambda: finished_row_with(page, marker), PAGE_DEADLINE, what="the call in the audit list")
    tools = page.locator("#result_list td.field-tool").all_inner_texts()
    assert tools and set(tools) == {"terminal_exec"}
    row = page.locator("#result_list tbody tr", has_text=marker)
    assert MARKUP in row.locator("td.field-arguments_summary").inner_text()
    assert row.locator("td.field-call_outcome").inner_text() == "ok"

    row.locator("th a").click()
    page.wait_for_selector("#call-arguments")
    assert f"echo '{MARKUP}' {marker}" in page.inner_text("#call-arguments")
    assert MARKUP in page.inner_text("#call-result")
    assert MARKUP in page.inner_text("#content")
    assert page.locator("img[src=x]").count() == 0
    assert token_name in page.inner_text("#call-who")

    page.click("#revoke-credential")
    page.wait_for_url("**/admin/oauth/bearertoken/*/revoke/")  # the confirmation: nothing is revoked yet
    assert token_name in page.content()
    assert dialogs == []


def test_the_csv_export_of_the_filtered_list_downloads_the_call(
    admin_page: Page, live_server: LiveServer, markup_call: tuple[str, str], tmp_path: Path, dialogs: list[str]
) -> None:
    marker, token_name = markup_call
    page = admin_page
    open_call_list_filtered_by_tool(page, live_server, "terminal_exec")
    poll(lambda: finished_row_with(page, marker), PAGE_DEADLINE, what="the call in the audit list")
    with page.expect_download() as download_info:
        page.click("#export-csv")
    download = download_info.value
    assert download.suggested_filename.startswith("audit-calls-") and download.suggested_filename.endswith(".csv")
    target = tmp_path / "export.csv"
    download.save_as(target)
    rows = list(csv.DictReader(io.StringIO(target.read_text(encoding="utf-8"))))
    assert rows and {row["tool"] for row in rows} == {"terminal_exec"}
    [call] = [row for row in rows if marker in row["command"]]
    assert call["command"] == f"echo '{MARKUP}' {marker}"
    assert (call["credential_name"], call["outcome"], call["exit_code"]) == (token_name, "ok", "0")
    assert dialogs == []


def test_the_overview_linked_from_the_admin_index_draws_the_calls(
    admin_page: Page, live_server: LiveServer, markup_call: tuple[str, str]
) -> None:
    page = admin_page
    page.goto(f"{live_server.url}/admin/")
    page.locator("#audit-overview-link").get_by_role("link", name="Overview").click()
    page.wait_for_url("**/admin/audit/overview/")
    for chart in ("#chart-hourly", "#chart-daily"):
        bars = page.locator(f"{chart} rect:not([data-count='0'])")
        assert bars.count() >= 1, chart
        box = bars.first.bounding_box()
        assert box is not None and box["height"] > 0, chart
    assert "terminal_exec" in page.inner_text("#audit-tools")
    assert markup_call[1] in page.inner_text("#audit-credentials")
