"""The audit list as an admin uses it, in headless Chromium at 1280 px: every column that matters in the window (why
a call failed and the agent's description of its command among them), outcomes as coloured badges, "failed
yesterday" of one credential in two clicks (and through the link the token page uses), several outcomes and tools
at once, exit codes, a custom from–to, a shared URL showing the same rows, and security events read as sentences.

Calls are appended to the live server's chain with the times a test needs (yesterday, today) by `manage.py shell`,
under credentials of this module's own, so rows of other tests never match.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, time, timedelta
from urllib.parse import parse_qs, urlsplit

import pytest
from playwright.sync_api import Browser, Page

from tests.artifacts import artifact_dir
from tests.browser import log_in_as_admin
from tests.live import LiveServer

pytestmark = [pytest.mark.live, pytest.mark.browser]

LIST = "/admin/audit/auditrecord/"
WIDTH = 1280
COLUMNS = (
    "time",
    "tool",
    "arguments_summary",
    "credential",
    "call_outcome",
    "call_failure",
    "duration",
    "call_exit_code",
)
LONG_PATH = "/srv/" + "deeply-nested-directory-name/" * 12 + "file.txt"
# A failed command's first line of stderr with no space to wrap at: the list cuts it and wraps it inside its column.
LONG_ERROR = f"bash: {LONG_PATH}: No such file or directory"

SEED = """
import json
from datetime import datetime
from audit.log import Actor, event
from audit.log.append import append_all
from audit.models import AuditRecord
spec = json.loads({spec!r})
for call in spec["calls"]:
    at = datetime.fromisoformat(call["at"])
    started = AuditRecord(
        kind="call.started", created_at=at, call_id=call["call_id"], tool=call["tool"], arguments=call["arguments"],
        user_id=1, username="admin", credential_kind="bearer", credential_id=call["credential_id"],
        credential_name=call["credential_name"], instance_id="audit-list-browser",
    )
    append_all([started])
    finished = AuditRecord(
        kind="call.finished", created_at=at, call_id=call["call_id"], tool=call["tool"], started=started,
        outcome=call["outcome"], exit_code=call["exit_code"], duration_ms=1234, instance_id="audit-list-browser",
        result_excerpt=call["result"],
    )
    append_all([finished])
for name, actor, detail in spec["events"]:
    event(name, Actor(**actor), **detail)
"""


@dataclass(frozen=True)
class Seeded:
    marker: str
    laptop: str  # credential ids
    ci: str
    yesterday: str  # YYYY-MM-DD, the server's time zone (UTC)
    today: str


def call(marker: str, label: str, at: datetime, credential: tuple[str, str], tool: str, outcome: str,
         arguments: dict[str, str] | None = None, exit_code: int | None = None,
         result: str = "seeded") -> dict[str, object]:  # fmt: skip
    return {
        "call_id": uuid.uuid4().hex,
        "at": at.isoformat(),
        "tool": tool,
        "arguments": arguments or {"command": f"run {marker} {label}"},
        "credential_id": credential[0],
        "credential_name": credential[1],
        "outcome": outcome,
        "exit_code": exit_code if exit_code is not None else 0 if outcome == "ok" else 2,
        "result": result,
    }


@pytest.fixture(scope="module")
def seeded(live_server: LiveServer) -> Seeded:
    marker = uuid.uuid4().hex[:10]
    number = str(uuid.uuid4().int % 10**6)
    laptop, ci = (f"{number}1", f"ui-{marker}-laptop"), (f"{number}2", f"ui-{marker}-ci")
    now = datetime.now(UTC)
    midnight = datetime.combine(now.date(), time(), tzinfo=UTC)
    yesterday = midnight - timedelta(days=1)
    calls = [
        call(marker, "y-error", yesterday + timedelta(hours=9), laptop, "terminal_exec", "error"),
        call(marker, "y-timeout", yesterday + timedelta(hours=10), laptop, "terminal_exec", "timeout", exit_code=124),
        call(
            marker,
            "y-read-ok",
            yesterday + timedelta(hours=11),
            laptop,
            "file_read",
            "ok",
            {"path": f"{marker} y-read-ok"},
        ),
        call(marker, "y-git-denied", yesterday + timedelta(hours=12), laptop, "git_status", "denied"),
        call(marker, "y-ci-error", yesterday + timedelta(hours=13), ci, "terminal_exec", "error"),
        call(
            marker,
            "t-error",
            max(midnight, now - timedelta(minutes=1)),
            laptop,
            "terminal_exec",
            "error",
            exit_code=127,
            result=f"stderr:\n{LONG_ERROR}\n\nexit_code: 127",
        ),
        call(
            marker,
            "t-long",
            max(midnight, now - timedelta(seconds=30)),
            laptop,
            "file_read",
            "ok",
            {"path": f"{marker} t-long {LONG_PATH}", "note": "x" * 500},
        ),  # fmt: skip
        call(
            marker,
            "t-long-command",
            max(midnight, now - timedelta(seconds=20)),
            ci,
            "terminal_exec",
            "ok",
            {
                "command": f"echo {marker} t-long-command --an-option-with-a-long-name=" + "v" * 300,
                "description": "Print a long option to see how the list wraps it; " + "w" * 200,
            },
        ),  # fmt: skip
    ]
    session = {"username": "admin", "credential_kind": "session", "client_address": "10.0.0.5"}
    shell = {"username": "root", "credential_kind": "shell"}
    events = [
        (
            "token.revoked",
            session,
            {"token_id": 9, "name": f"ui-{marker}-laptop", "prefix": "sst_abcd", "owner": "admin", "scope": "mcp"},
        ),  # fmt: skip
        (
            "credentials.rotated",
            shell,
            {
                "bearer_tokens": 3,
                "clients": 2,
                "access_tokens": 0,
                "refresh_tokens": 0,
                "grants": 0,
                "sessions": 0,
                "new_token_prefix": f"sst_{marker[:4]}",
                "new_token_owner": "admin",
            },
        ),  # fmt: skip
        ("admin.login_failed", {"username": f"<b>bob-{marker}</b>", "client_address": "10.0.0.7"}, {}),
        ("token.first_used", {"client_address": "127.0.0.1"}, {"token_id": 1, "name": f"first-run-{marker}"}),
    ]
    live_server.manage("shell", "-c", SEED.format(spec=json.dumps({"calls": calls, "events": events})))
    return Seeded(marker, laptop[0], ci[0], yesterday.date().isoformat(), now.date().isoformat())


@pytest.fixture
def wide_page(browser: Browser, live_server: LiveServer) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": WIDTH, "height": 900})
    page = context.new_page()
    log_in_as_admin(page, live_server)
    yield page
    context.close()


def labels(page: Page, marker: str) -> set[str]:
    """The seeded labels (y-error, t-error, ...) of the rows the list shows."""
    texts = page.locator("#result_list td.field-arguments_summary").all_inner_texts()
    return {text.split(f"{marker} ", 1)[1].split()[0] for text in texts if f"{marker} " in text}


def query_of(page: Page) -> dict[str, list[str]]:
    return parse_qs(urlsplit(page.url).query)


def test_the_list_at_1280_px_shows_the_columns_that_matter_without_scrolling_sideways(
    wide_page: Page, live_server: LiveServer, seeded: Seeded
) -> None:
    page = wide_page
    page.goto(f"{live_server.url}{LIST}")
    assert page.locator("#result_list tbody tr", has_text=LONG_PATH[:40]).count() >= 1  # the long arguments are shown
    page.screenshot(path=str(artifact_dir() / "audit-list.png"), full_page=False)
    sizes = page.evaluate(
        """() => {
            const table = document.querySelector('#result_list');
            return {page: [document.documentElement.scrollWidth, document.documentElement.clientWidth],
                    table: [table.scrollWidth, table.parentElement.clientWidth, table.getBoundingClientRect().right]};
        }"""
    )
    assert sizes["page"][0] <= sizes["page"][1], sizes
    assert sizes["table"][0] <= sizes["table"][1] and sizes["table"][2] <= WIDTH, sizes
    for column in COLUMNS:
        header = page.locator(f"#result_list thead th.column-{column}")
        box = header.bounding_box()
        assert box is not None and box["width"] > 0 and box["x"] >= 0 and box["x"] + box["width"] <= WIDTH, column
    row = page.locator("#result_list tbody tr", has_text=f"{seeded.marker} t-error")
    why = row.locator("td.field-call_failure")
    assert why.inner_text().startswith(LONG_ERROR[:60]) and why.inner_text().endswith("…")  # stderr's first line, cut
    assert why.evaluate("cell => cell.scrollWidth <= cell.clientWidth")  # wrapped inside its column
    described = page.locator("#result_list tbody tr", has_text=f"{seeded.marker} t-long-command").locator(
        "td.field-arguments_summary .agent-says"
    )
    assert described.inner_text().startswith("agent says: Print a long option")
    assert described.evaluate("element => getComputedStyle(element).fontStyle") == "italic"
    assert row.locator("th.field-time").inner_text().endswith(" UTC")
    badge = row.locator("td.field-call_outcome .audit-outcome")
    assert badge.inner_text() == "error"
    colour = badge.evaluate("element => getComputedStyle(element).backgroundColor")
    assert colour not in ("rgba(0, 0, 0, 0)", "transparent"), colour


def test_failed_calls_of_one_credential_yesterday_are_two_clicks_from_the_list(
    wide_page: Page, live_server: LiveServer, seeded: Seeded, browser: Browser
) -> None:
    page = wide_page
    page.goto(f"{live_server.url}{LIST}")
    row = page.locator("#result_list tbody tr", has_text=f"{seeded.marker} y-error")
    row.get_by_role("link", name=f"bearer:ui-{seeded.marker}-laptop", exact=True).click()  # click 1: its calls
    page.wait_for_url(lambda url: "credential=" in url)
    page.locator("#audit-filters").get_by_role("link", name="Failed yesterday", exact=True).click()  # click 2
    page.wait_for_url(lambda url: "range=yesterday" in url)
    assert query_of(page) == {"credential": [f"bearer:{seeded.laptop}"], "outcome": ["failed"], "range": ["yesterday"]}
    expected = {"y-error", "y-timeout", "y-git-denied"}
    assert labels(page, seeded.marker) == expected
    assert len(page.locator("#result_list tbody tr").all()) == len(expected)  # nobody else's calls

    shared = page.url
    page.reload()
    assert labels(page, seeded.marker) == expected
    other = browser.new_context(viewport={"width": WIDTH, "height": 900})
    try:
        fresh = other.new_page()
        log_in_as_admin(fresh, live_server)
        fresh.goto(shared)  # the same view, opened by someone the URL was sent to
        assert labels(fresh, seeded.marker) == expected
    finally:
        other.close()


def test_the_token_page_link_shows_yesterdays_failed_calls_of_that_token(
    wide_page: Page, live_server: LiveServer, seeded: Seeded
) -> None:
    page = wide_page
    page.goto(f"{live_server.url}{LIST}?credential=bearer:{seeded.laptop}&outcome=failed&range=yesterday")
    assert labels(page, seeded.marker) == {"y-error", "y-timeout", "y-git-denied"}
    page.goto(f"{live_server.url}{LIST}?credential=bearer:{seeded.ci}&outcome=failed&range=yesterday")
    assert labels(page, seeded.marker) == {"y-ci-error"}
    active = page.locator("#audit-filter-outcome a.active").all_inner_texts()
    assert [text.strip() for text in active] == ["failed"]


def test_several_outcomes_and_several_tools_at_once(wide_page: Page, live_server: LiveServer, seeded: Seeded) -> None:
    page = wide_page
    page.goto(f"{live_server.url}{LIST}?credential=bearer:{seeded.laptop}")
    outcomes = page.locator("#audit-filter-outcome")
    outcomes.get_by_role("link", name="error", exact=True).click()
    page.wait_for_url(lambda url: "outcome=error" in url)
    page.locator("#audit-filter-outcome").get_by_role("link", name="timeout", exact=True).click()
    page.wait_for_url(lambda url: "outcome=timeout" in url)
    assert query_of(page)["outcome"] == ["error", "timeout"]
    assert labels(page, seeded.marker) == {"y-error", "y-timeout", "t-error"}

    page.goto(f"{live_server.url}{LIST}?credential=bearer:{seeded.laptop}")
    page.click("#audit-menu-tool > summary")
    menu = page.locator("#audit-menu-tool")
    menu.get_by_label("file_read", exact=True).check()
    menu.get_by_label("git_status", exact=True).check()
    menu.get_by_role("button", name="Apply").click()
    page.wait_for_url(lambda url: "tool=" in url)
    assert sorted(query_of(page)["tool"]) == ["file_read", "git_status"]
    assert query_of(page)["credential"] == [f"bearer:{seeded.laptop}"]
    assert labels(page, seeded.marker) == {"y-read-ok", "y-git-denied", "t-long"}
    tools = set(page.locator("#result_list td.field-tool").all_inner_texts())
    assert tools == {"file_read", "git_status"}


def test_the_exit_code_filter_narrows_the_list(wide_page: Page, live_server: LiveServer, seeded: Seeded) -> None:
    page = wide_page
    page.goto(f"{live_server.url}{LIST}?credential=bearer:{seeded.laptop}")
    assert labels(page, seeded.marker) >= {"y-error", "y-read-ok", "t-error", "t-long"}
    page.locator("#audit-filter-exit-code").get_by_role("link", name="127", exact=True).click()
    page.wait_for_url(lambda url: "exit_code=127" in url)
    assert labels(page, seeded.marker) == {"t-error"}
    page.fill("#audit-exit-code", "124")  # one the links do offer, typed: the same filter
    page.click("#audit-exit-code-apply")
    page.wait_for_url(lambda url: "exit_code=124" in url)
    assert query_of(page) == {"credential": [f"bearer:{seeded.laptop}"], "exit_code": ["127", "124"]}
    assert labels(page, seeded.marker) == {"t-error", "y-timeout"}
    page.locator("#audit-filter-exit-code").get_by_role("link", name="nonzero", exact=True).click()
    page.wait_for_url(lambda url: "exit_code=nonzero" in url)
    assert labels(page, seeded.marker) == {"y-error", "y-timeout", "y-git-denied", "t-error"}
    page.locator("#audit-filter-exit-code").get_by_role("link", name="any", exact=True).click()
    page.wait_for_url(lambda url: "exit_code" not in url)
    assert labels(page, seeded.marker) >= {"y-read-ok", "t-long"}


def test_a_custom_from_to_range_keeps_whole_days(wide_page: Page, live_server: LiveServer, seeded: Seeded) -> None:
    page = wide_page
    page.goto(f"{live_server.url}{LIST}?credential=bearer:{seeded.laptop}&tool=terminal_exec")
    page.fill("#audit-since", seeded.yesterday)
    page.fill("#audit-until", seeded.yesterday)
    page.click("#audit-dates-apply")
    page.wait_for_url(lambda url: "since=" in url)
    assert query_of(page)["since"] == [seeded.yesterday] and query_of(page)["until"] == [seeded.yesterday]
    assert query_of(page)["tool"] == ["terminal_exec"]
    assert labels(page, seeded.marker) == {"y-error", "y-timeout"}
    page.fill("#audit-since", seeded.today)
    page.fill("#audit-until", seeded.today)
    page.click("#audit-dates-apply")
    page.wait_for_url(lambda url: f"since={seeded.today}" in url)
    assert labels(page, seeded.marker) == {"t-error"}


def test_a_wrong_filter_says_which_parameter_is_wrong(wide_page: Page, live_server: LiveServer) -> None:
    page = wide_page
    response = page.goto(f"{live_server.url}{LIST}?range=tomorrow&tool=file_read")
    assert response is not None and response.status == 400
    assert "range" in page.inner_text("#audit-filter-error") and "tomorrow" in page.inner_text("#audit-filter-error")
    page.click("#audit-filter-without")
    page.wait_for_url(lambda url: url.endswith(f"{LIST}?tool=file_read"))
    assert page.locator("#result_list").count() == 1


def test_security_events_read_as_sentences(wide_page: Page, live_server: LiveServer, seeded: Seeded) -> None:
    page = wide_page
    page.goto(f"{live_server.url}/admin/audit/securityevent/")
    sentences = page.locator("#result_list td.field-what_happened").all_inner_texts()
    marker = seeded.marker
    assert f"admin revoked token ui-{marker}-laptop (sst_abcd…) from 10.0.0.5" in sentences
    assert (
        "OS user root, on the command line, rotated all credentials: 3 bearer tokens, 2 clients; "
        f"new token sst_{marker[:4]}… for admin" in sentences
    )
    assert f"login failed for ‘<b>bob-{marker}</b>’ from 10.0.0.7" in sentences  # the markup shown as text
    assert page.locator("#result_list b", has_text=f"bob-{marker}").count() == 0
    assert f"token first-run-{marker} first used from 127.0.0.1" in sentences
    page.locator("#result_list tbody tr", has_text="rotated all credentials").first.locator("th a").click()
    page.wait_for_selector(".audit-detail-json")
    raw = json.loads(page.inner_text(".audit-detail-json"))
    assert raw["bearer_tokens"] == 3 and raw["clients"] == 2
