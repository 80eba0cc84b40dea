"""The command policy page in headless Chromium, as an admin meets it: from the home page to the policy, the
recommended set switched on, a rule of one's own added and moved up, the order kept over a reload, Back that submits
nothing again, the rule deleted after Django's confirmation, and the recommended set switched off. Every step is a
POST with its CSRF token, answered by a redirect; the audit log holds one `policy.changed` record per change."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page

from mcpserver.policy.recommended import RECOMMENDED
from tests.live import LiveServer

pytestmark = [pytest.mark.live, pytest.mark.browser]
PAGE = "/admin/mcpserver/policyrule/"
RECOMMENDED_ORDER = [spec["id"] for spec in RECOMMENDED]
RULES_SQL = "SELECT rule_id, spec, enabled FROM mcpserver_policyrule ORDER BY position, id"


def stored_rules(server: LiveServer) -> list[dict[str, Any]]:
    return server.database.query(RULES_SQL)


def actions_since(server: LiveServer, record_id: int) -> list[str]:
    rows = server.database.query(
        "SELECT detail FROM audit_auditrecord WHERE event = 'policy.changed' AND id > %s ORDER BY id", record_id
    )
    return [(json.loads(row["detail"]) if isinstance(row["detail"], str) else row["detail"])["action"] for row in rows]


def last_record_id(server: LiveServer) -> int:
    return int(server.database.query("SELECT COALESCE(MAX(id), 0) AS id FROM audit_auditrecord")[0]["id"])


def stored_document(server: LiveServer) -> dict[str, Any]:
    """The server's policy as policy_export would write it, read from its database."""
    rules = []
    for row in stored_rules(server):
        spec = json.loads(row["spec"]) if isinstance(row["spec"], str) else row["spec"]
        rules.append(spec if row["enabled"] else {**spec, "enabled": False})
    document: dict[str, Any] = {"rules": rules}
    for settings in server.database.query('SELECT "default", opaque FROM mcpserver_policysettings WHERE id = 1'):
        document["default"] = settings["default"]
        if settings["opaque"]:
            document["opaque"] = settings["opaque"]
    return document


def load(server: LiveServer, document: dict[str, Any], path: Path) -> None:
    path.write_text(json.dumps(document), encoding="utf-8")
    server.manage("policy_load", str(path))


@pytest.fixture
def no_rules(live_server: LiveServer, tmp_path: Path) -> Iterator[None]:
    """The shared server without rules for the test, and its policy as it was afterwards: a failure halfway must not
    leave the recommended rules deciding the calls of later tests."""
    before = stored_document(live_server)
    if before["rules"]:
        load(live_server, {"rules": []}, tmp_path / "empty.json")
    yield
    if stored_document(live_server)["rules"] != before["rules"]:
        load(live_server, before, tmp_path / "before.json")


def shown_rules(page: Page) -> list[str]:
    return page.locator("#policy-rules tbody tr").evaluate_all("rows => rows.map(row => row.dataset.ruleId)")


def success_message(page: Page) -> str:
    return page.locator("ul.messagelist li.success").inner_text()


def test_an_admin_switches_on_the_recommended_set_adds_moves_and_deletes_a_rule(
    admin_page: Page, live_server: LiveServer, no_rules: None
) -> None:
    page, rule_id = admin_page, f"browser-{uuid.uuid4().hex[:8]}"
    start = last_record_id(live_server)
    page.goto(f"{live_server.url}/admin/")
    page.click("#task-policy")
    page.wait_for_url(f"**{PAGE}")
    assert "not a security boundary" in page.locator("#policy-intro").inner_text()

    page.click("#policy-recommended-on")
    assert success_message(page).startswith(f"Switched on {len(RECOMMENDED)} recommended rules, at the top")
    assert shown_rules(page) == RECOMMENDED_ORDER
    assert page.locator("#policy-recommended-on").count() == 0

    page.click("#policy-add")
    page.wait_for_url(f"**{PAGE}add/")
    page.fill("#id_rule_id", rule_id)
    page.check("input[name=decision][value=deny]")
    page.fill("#id_commands", f"echo {rule_id}\nrm -r when:outside-workspace")
    page.fill("#id_description", "Added by the browser test.")
    page.click("input[name=_save]")
    page.wait_for_url(f"**{PAGE}")
    assert shown_rules(page) == [*RECOMMENDED_ORDER, rule_id]
    row = page.locator(f'tr[data-rule-id="{rule_id}"]')
    assert row.locator(".policy-decision").inner_text() == "deny"
    assert row.locator(".policy-commands").inner_text().splitlines() == [
        f"echo {rule_id}",
        "rm -r when:outside-workspace",
    ]

    row.locator("button.policy-move-up").click()
    page.wait_for_url(f"**{PAGE}#rule-*")
    moved = [*RECOMMENDED_ORDER[:-1], rule_id, RECOMMENDED_ORDER[-1]]
    assert success_message(page) == f"Moved rule “{rule_id}” up to place {len(RECOMMENDED)}."
    assert shown_rules(page) == moved
    version = page.locator("#policy-version").inner_text()

    page.reload()  # the order is stored; the message was shown once; nothing is done again
    assert shown_rules(page) == moved
    assert page.locator("ul.messagelist").count() == 0
    assert page.locator("#policy-version").inner_text() == version

    page.go_back()  # the list the add led to, fetched again: not the move submitted again
    page.wait_for_url(f"**{PAGE}")
    assert shown_rules(page) == moved
    page.go_back()  # the add form: shown empty, not posted again
    page.wait_for_url(f"**{PAGE}add/")
    assert page.locator("#id_rule_id").input_value() in ("", rule_id)
    assert [row["rule_id"] for row in stored_rules(live_server)] == moved  # one rule of that id, in its place
    page.go_forward()
    page.wait_for_url(f"**{PAGE}")
    assert page.locator("#policy-version").inner_text() == version

    page.locator(f'tr[data-rule-id="{rule_id}"] a.policy-delete').click()
    page.wait_for_url(f"**{PAGE}*/delete/")
    assert rule_id in page.locator("#content").inner_text()
    assert rule_id in [row["rule_id"] for row in stored_rules(live_server)]  # asking deleted nothing yet
    page.click("input[type=submit]")  # "Yes, I'm sure"
    page.wait_for_url(f"**{PAGE}")
    assert rule_id in success_message(page) and "deleted" in success_message(page)
    assert shown_rules(page) == RECOMMENDED_ORDER

    page.click("#policy-recommended-off")
    assert success_message(page) == f"Switched off the recommended set: removed {len(RECOMMENDED)} rules."
    assert page.locator("#policy-no-rules").is_visible()
    assert stored_rules(live_server) == []
    assert actions_since(live_server, start) == ["recommended_on", "added", "moved_up", "deleted", "recommended_off"]
