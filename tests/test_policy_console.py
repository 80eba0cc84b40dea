"""The console's command policy page (mcpserver/admin_policy.py) through Django's test client: the rule form (a rule
saved as the engine reads it, errors on the field and line they are about, nothing saved), order, enable and
disable, delete, the settings, the recommended set switched on and off, the JSON download, and who may reach it.
Every change bumps the policy's version once and writes one `policy.changed` record; one that changes nothing
does neither."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from audit.models import AuditRecord
from mcpserver.models import PolicyRule, PolicySettings
from mcpserver.policy.recommended import RECOMMENDED
from mcpserver.policy.rules import Rule
from mcpserver.policy_source import document_text, load_policy, policy_document, policy_version, replace_policy

pytestmark = pytest.mark.django_db

PAGE = "/admin/mcpserver/policyrule/"
ADD = f"{PAGE}add/"
RECOMMENDED_ORDER = [spec["id"] for spec in RECOMMENDED]
XSS = "<img src=x onerror=alert(1)>"


def rule_ids() -> list[str]:
    return list(PolicyRule.objects.order_by("position", "id").values_list("rule_id", flat=True))


def row(rule_id: str) -> PolicyRule:
    return PolicyRule.objects.get(rule_id=rule_id)


def changes() -> list[Any]:  # the records' detail
    return [record.detail for record in AuditRecord.objects.filter(event="policy.changed").order_by("id")]


def form_data(**fields: Any) -> dict[str, Any]:
    return {"rule_id": "no-force-push", "decision": "ask", "enabled": "on", "approver": "staff", **fields}


def seed(*rules: dict[str, Any]) -> None:
    replace_policy({"default": "allow", "rules": list(rules)}, by="test")


def page_rows(client: Client) -> list[str]:
    return re.findall(r'<tr id="rule-\d+" data-rule-id="([^"]+)"', client.get(PAGE).content.decode())


@pytest.fixture
def three_rules() -> None:
    seed(
        {"id": "first", "decision": "deny", "commands": ["mkfs"]},
        {"id": "second", "decision": "ask", "commands": ["sudo"]},
        {"id": "third", "decision": "allow", "tools": ["file_read"]},
    )


class OneChange:
    """Checks that the code in its block bumped the version once and wrote one policy.changed record."""

    def __init__(self) -> None:
        self.version = policy_version()
        self.records = len(changes())

    def detail(self) -> dict[str, Any]:
        assert policy_version() == self.version + 1
        found = changes()
        assert len(found) == self.records + 1
        assert found[-1]["version"] == self.version + 1
        return found[-1]

    def none(self) -> None:
        assert policy_version() == self.version and len(changes()) == self.records


# --- the page ---------------------------------------------------------------------------------------------------


def test_the_page_lists_the_rules_in_order_with_what_each_is_about(admin_client: Client) -> None:
    seed(
        {"id": "dotfiles", "decision": "ask", "paths": ["~/.*"], "approver": "user"},
        {"id": "many", "decision": "deny", "who": {"users": ["alice"]}, "commands": ["a", "b", "c", "d", "e"]},
        {"id": "reads", "decision": "allow", "tools": ["file_read"], "enabled": False},
    )
    page = admin_client.get(PAGE).content.decode()
    assert page_rows(admin_client) == ["dotfiles", "many", "reads"]
    assert '<span class="policy-decision policy-decision-deny">deny</span>' in page
    assert "staff, or the client&#x27;s own user" in page  # the ask rule's approver
    assert "users alice" in page and "and 2 more" in page and "path ~/.*" in page
    assert re.search(r'data-rule-id="reads" class="policy-disabled"', page)
    assert "not a security boundary" in page and "applies to the next" in page
    assert 'href="/admin/mcpserver/policyrule/export/"' in page


def test_the_home_page_links_to_the_policy_page(admin_client: Client) -> None:
    assert f'href="{PAGE}" id="task-policy">Command policy</a>' in admin_client.get("/admin/").content.decode()


def test_rule_text_is_escaped(admin_client: Client) -> None:
    seed({"id": "x", "decision": "deny", "commands": [f"echo '{XSS}'"], "description": XSS})
    page = admin_client.get(PAGE).content.decode()
    assert XSS not in page and "&lt;img src=x onerror=alert(1)&gt;" in page


def test_a_stored_rule_that_does_not_read_is_named_on_the_page(admin_client: Client) -> None:
    seed({"id": "fine", "decision": "deny", "commands": ["mkfs"]})
    PolicyRule.objects.filter(rule_id="fine").update(spec={"id": "fine", "decision": "perhaps"})
    page = admin_client.get(PAGE).content.decode()
    assert "does not read: (&#x27;fine&#x27;): decision: must be one of allow, ask, deny" in page
    assert 'id="policy-broken"' in page


# --- the form ---------------------------------------------------------------------------------------------------


def test_a_rule_added_through_the_form_is_stored_as_the_engine_reads_it(admin_client: Client) -> None:
    seed({"id": "existing", "decision": "deny", "commands": ["mkfs"]})
    change = OneChange()
    response = admin_client.post(
        ADD,
        form_data(
            users="alice, bob\ncarol",
            scopes=["mcp:read"],
            tools="terminal_exec",
            commands="git push -f|--force\n\nrm -r when:outside-repos",
            description="  Forced pushes drop commits.  ",
        ),
    )
    assert response.status_code == 302 and response["Location"] == PAGE
    expected = {
        "id": "no-force-push",
        "decision": "ask",
        "who": {"users": ["alice", "bob", "carol"], "scopes": ["mcp:read"]},
        "tools": ["terminal_exec"],
        "commands": ["git push -f|--force", {"pattern": "rm -r", "when": "outside-repos"}],
        "description": "Forced pushes drop commits.",
    }
    assert row("no-force-push").spec == expected
    assert Rule.from_dict(expected).to_dict() == expected
    assert rule_ids() == ["existing", "no-force-push"]  # at the end by default
    assert row("no-force-push").updated_by == "admin"
    detail = change.detail()
    assert detail["action"] == "added" and detail["rule_id"] == "no-force-push"
    assert detail["before"] is None and detail["after"] == expected
    assert [rule.id for rule in load_policy().policy.rules] == ["existing", "no-force-push"]


def test_a_new_rule_goes_where_its_position_says(admin_client: Client, three_rules: None) -> None:
    admin_client.post(ADD, form_data(rule_id="top", decision="deny", commands="halt", position="1"))
    admin_client.post(ADD, form_data(rule_id="third-place", decision="deny", commands="reboot", position="3"))
    admin_client.post(ADD, form_data(rule_id="far", decision="deny", commands="poweroff", position="99"))
    assert rule_ids() == ["top", "first", "third-place", "second", "third", "far"]


@pytest.mark.parametrize(
    ("fields", "field", "message"),
    [
        ({"commands": "ls\nrm 'unclosed"}, "commands", "line 2: cannot read &quot;rm &#x27;unclosed&quot; as shell"),
        ({"commands": "/bin/rm -r"}, "commands", "a command is matched by its name, without a directory"),
        ({"commands": "rm -r when:outside-home"}, "commands", "line 1: when: must be one of"),
        ({"commands": "rm [z-a]"}, "commands", "is not a glob: bad character range z-a"),
        ({"paths": "~/.ssh/**", "tools": "terminal_kill"}, "paths", "apply only to tools with path arguments"),
        ({"tools": "shell_exec"}, "tools", "&#x27;shell_exec&#x27; names no tool"),
        ({"rule_id": "-starts-with-a-dash"}, "rule_id", "needs 1 to 64 letters"),
        ({"rule_id": "default"}, "rule_id", "is what verdicts name when no rule decided"),
        ({"decision": "deny", "approver": "user", "commands": "ls"}, "approver", "only an ask rule has approvers"),
    ],
)
def test_a_rule_that_does_not_read_shows_why_on_its_field_and_saves_nothing(
    admin_client: Client, fields: dict[str, str], field: str, message: str
) -> None:
    change = OneChange()
    response = admin_client.post(ADD, form_data(**fields))
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert list(errors) == [field]
    assert message in response.content.decode()
    assert PolicyRule.objects.count() == 0
    change.none()


def test_an_id_another_rule_has_is_refused(admin_client: Client, three_rules: None) -> None:
    response = admin_client.post(ADD, form_data(rule_id="second", commands="ls"))
    assert response.context["adminform"].form.errors["rule_id"] == ["Another rule has this id."]
    assert rule_ids() == ["first", "second", "third"]


def test_the_form_shows_a_rule_as_it_was_written_and_an_edit_records_before_and_after(
    admin_client: Client,
) -> None:
    spec = {
        "id": "rm-tree",
        "decision": "ask",
        "who": {"credentials": ["laptop", "ci"]},
        "commands": ["rm -r", {"pattern": "rm -R", "when": "outside-repos"}],
        "approver": "user",
    }
    seed(spec)
    url = f"{PAGE}{row('rm-tree').pk}/change/"
    form = admin_client.get(url).context["adminform"].form
    assert form["commands"].value() == "rm -r\nrm -R when:outside-repos"
    assert form["credentials"].value() == "laptop\nci" and form["approver"].value() == "user"
    assert "How patterns read" in admin_client.get(url).content.decode()
    change = OneChange()
    response = admin_client.post(
        url, form_data(rule_id="rm-tree", credentials="laptop", commands="rm -r", approver="user", enabled="")
    )
    assert response.status_code == 302
    after = {"id": "rm-tree", "decision": "ask", "who": {"credentials": ["laptop"]}, "commands": ["rm -r"],
             "approver": "user"}  # fmt: skip
    assert row("rm-tree").spec == after and not row("rm-tree").enabled
    detail = change.detail()
    assert detail["action"] == "edited" and detail["before"] == spec
    assert detail["after"] == {**after, "enabled": False}


def test_saving_a_rule_unchanged_makes_no_new_version(admin_client: Client) -> None:
    seed({"id": "keep", "decision": "deny", "commands": ["mkfs"]})
    change = OneChange()
    url = f"{PAGE}{row('keep').pk}/change/"
    assert admin_client.post(url, form_data(rule_id="keep", decision="deny", commands="mkfs")).status_code == 302
    change.none()


def test_a_bad_edit_leaves_the_stored_rule_as_it_was(admin_client: Client) -> None:
    seed({"id": "keep", "decision": "deny", "commands": ["mkfs"]})
    change = OneChange()
    url = f"{PAGE}{row('keep').pk}/change/"
    response = admin_client.post(url, form_data(rule_id="keep", decision="deny", commands="mkfs |"))
    assert "each side of a `|` needs a command" in response.content.decode()
    assert row("keep").spec == {"id": "keep", "decision": "deny", "commands": ["mkfs"]}
    change.none()


# --- order, enable, delete -------------------------------------------------------------------------------------


def test_moving_a_rule_changes_the_order_one_place_at_a_time(admin_client: Client, three_rules: None) -> None:
    change = OneChange()
    response = admin_client.post(f"{PAGE}{row('third').pk}/move/", {"direction": "up"})
    assert response.status_code == 302 and response["Location"] == f"{PAGE}#rule-{row('third').pk}"
    assert rule_ids() == ["first", "third", "second"]
    detail = change.detail()
    assert detail["action"] == "moved_up" and detail["rule_id"] == "third"
    assert (detail["before"], detail["after"]) == ({"number": 3}, {"number": 2})
    admin_client.post(f"{PAGE}{row('first').pk}/move/", {"direction": "down"})
    assert rule_ids() == ["third", "first", "second"]
    assert [rule.id for rule in load_policy().policy.rules] == ["third", "first", "second"]


@pytest.mark.parametrize(("rule_id", "direction"), [("first", "up"), ("third", "down")])
def test_moving_past_either_end_changes_nothing(
    admin_client: Client, three_rules: None, rule_id: str, direction: str
) -> None:
    change = OneChange()
    response = admin_client.post(f"{PAGE}{row(rule_id).pk}/move/", {"direction": direction}, follow=True)
    assert "already" in response.content.decode()
    assert rule_ids() == ["first", "second", "third"]
    change.none()


def test_a_disabled_rule_stays_on_the_page_but_decides_nothing(admin_client: Client, three_rules: None) -> None:
    change = OneChange()
    admin_client.post(f"{PAGE}{row('second').pk}/enabled/", {"enabled": "off"})
    assert not row("second").enabled
    assert [rule.id for rule in load_policy().policy.rules] == ["first", "third"]
    assert page_rows(admin_client) == ["first", "second", "third"]
    detail = change.detail()
    assert detail["action"] == "disabled" and detail["after"] == {"id": "second", "decision": "ask",
                                                                  "commands": ["sudo"], "enabled": False}  # fmt: skip
    again = OneChange()
    admin_client.post(f"{PAGE}{row('second').pk}/enabled/", {"enabled": "off"})  # a second click: no change
    again.none()
    admin_client.post(f"{PAGE}{row('second').pk}/enabled/", {"enabled": "on"})
    assert row("second").enabled and again.detail()["action"] == "enabled"


def test_delete_asks_first_then_removes_the_rule(admin_client: Client, three_rules: None) -> None:
    url = f"{PAGE}{row('second').pk}/delete/"
    confirmation = admin_client.get(url).content.decode()
    assert "Are you sure" in confirmation and "Command policy</a>" in confirmation
    assert rule_ids() == ["first", "second", "third"]
    change = OneChange()
    response = admin_client.post(url, {"post": "yes"})
    assert response.status_code == 302 and response["Location"] == PAGE
    assert rule_ids() == ["first", "third"]
    detail = change.detail()
    assert detail["action"] == "deleted" and detail["rule_id"] == "second"
    assert detail["before"] == {"id": "second", "decision": "ask", "commands": ["sudo"]} and detail["after"] is None


# --- settings and the recommended set -------------------------------------------------------------------------


def test_the_settings_change_the_default_and_the_opaque_decision(admin_client: Client) -> None:
    change = OneChange()
    admin_client.post(f"{PAGE}settings/", {"default": "ask", "opaque": "deny"})
    settings_row = PolicySettings.objects.get(pk=1)
    assert (settings_row.default, settings_row.opaque) == ("ask", "deny")
    assert load_policy().policy.default == "ask" and load_policy().policy.opaque == "deny"
    detail = change.detail()
    assert detail["action"] == "settings"
    assert detail["before"] == {"default": "allow", "opaque": None}
    assert detail["after"] == {"default": "ask", "opaque": "deny"}
    again = OneChange()
    admin_client.post(f"{PAGE}settings/", {"default": "ask", "opaque": "deny"})
    again.none()
    admin_client.post(f"{PAGE}settings/", {"default": "allow", "opaque": ""})  # automatic again
    assert load_policy().policy.opaque is None and again.detail()["after"] == {"default": "allow", "opaque": None}


def test_settings_outside_the_choices_change_nothing(admin_client: Client) -> None:
    change = OneChange()
    response = admin_client.post(f"{PAGE}settings/", {"default": "maybe", "opaque": ""}, follow=True)
    assert "were not changed" in response.content.decode()
    change.none()


def test_the_recommended_set_goes_first_in_its_order_and_comes_off_again(admin_client: Client) -> None:
    seed({"id": "mine", "decision": "deny", "commands": ["halt"]})
    change = OneChange()
    response = admin_client.post(f"{PAGE}recommended/", {"switch": "on"}, follow=True)
    assert f"Switched on {len(RECOMMENDED)} recommended rules, at the top" in response.content.decode()
    assert rule_ids() == [*RECOMMENDED_ORDER, "mine"]
    assert page_rows(admin_client) == [*RECOMMENDED_ORDER, "mine"]
    assert all(row(rule_id).recommended for rule_id in RECOMMENDED_ORDER) and not row("mine").recommended
    assert [rule.to_dict() for rule in load_policy().policy.rules[:-1]] == [
        Rule.from_dict(spec).to_dict() for spec in RECOMMENDED
    ]
    detail = change.detail()
    assert detail["action"] == "recommended_on" and detail["rule_ids"] == RECOMMENDED_ORDER
    assert 'id="policy-recommended-on"' not in admin_client.get(PAGE).content.decode()  # nothing left to add

    off = OneChange()
    admin_client.post(f"{PAGE}recommended/", {"switch": "off"})
    assert rule_ids() == ["mine"]
    detail = off.detail()
    assert detail["action"] == "recommended_off" and detail["rule_ids"] == RECOMMENDED_ORDER
    assert len(detail["before"]) == len(RECOMMENDED) and detail["after"] is None


def test_switching_on_adds_only_the_missing_recommended_rules(admin_client: Client) -> None:
    admin_client.post(f"{PAGE}recommended/", {"switch": "on"})
    admin_client.post(f"{PAGE}{row('privilege').pk}/delete/", {"post": "yes"})
    admin_client.post(ADD, form_data(rule_id="mine", decision="deny", commands="halt", position="1"))
    change = OneChange()
    admin_client.post(f"{PAGE}recommended/", {"switch": "on"})
    assert rule_ids() == ["privilege", "mine", *[rule_id for rule_id in RECOMMENDED_ORDER if rule_id != "privilege"]]
    assert change.detail()["rule_ids"] == ["privilege"]
    again = OneChange()
    response = admin_client.post(f"{PAGE}recommended/", {"switch": "on"}, follow=True)
    assert "all switched on already" in response.content.decode()
    again.none()


def test_a_rule_of_ones_own_with_a_recommended_id_is_reported_and_kept(admin_client: Client) -> None:
    mine = {"id": "force-push", "decision": "deny", "commands": ["git push"]}
    admin_client.post(ADD, form_data(rule_id="force-push", decision="deny", commands="git push"))
    change = OneChange()
    response = admin_client.post(f"{PAGE}recommended/", {"switch": "on"}, follow=True)
    page = response.content.decode()
    assert f"Switched on {len(RECOMMENDED) - 1} recommended rules" in page
    assert "Not added: force-push: a rule of your own has that id" in page
    assert row("force-push").spec == mine and not row("force-push").recommended
    assert rule_ids() == [*[rule_id for rule_id in RECOMMENDED_ORDER if rule_id != "force-push"], "force-push"]
    assert change.detail()["not_added"] == ["force-push"]
    admin_client.post(f"{PAGE}recommended/", {"switch": "off"})
    assert rule_ids() == ["force-push"]  # switching off leaves the rule of one's own


def test_a_recommended_rule_edited_is_marked_changed(admin_client: Client) -> None:
    admin_client.post(f"{PAGE}recommended/", {"switch": "on"})
    url = f"{PAGE}{row('privilege').pk}/change/"
    admin_client.post(url, form_data(rule_id="privilege", decision="deny", commands="sudo|doas|su|pkexec"))
    page = admin_client.get(PAGE).content.decode()
    assert page.count("recommended, changed") == 1 and row("privilege").recommended


# --- the download and who may come -----------------------------------------------------------------------------


def test_the_download_is_what_policy_export_writes(admin_client: Client, three_rules: None) -> None:
    admin_client.post(f"{PAGE}{row('second').pk}/enabled/", {"enabled": "off"})
    response = admin_client.get(f"{PAGE}export/")
    assert response["Content-Type"] == "application/json; charset=utf-8"
    assert response["Content-Disposition"] == 'attachment; filename="sandstorm-policy.json"'
    assert response.content.decode() == document_text(policy_document())
    assert json.loads(response.content)["rules"][1] == {"id": "second", "decision": "ask", "commands": ["sudo"],
                                                        "enabled": False}  # fmt: skip


ACTIONS = [
    ("get", PAGE, {}),
    ("get", ADD, {}),
    ("get", f"{PAGE}export/", {}),
    ("post", ADD, form_data(commands="ls")),
    ("post", f"{PAGE}recommended/", {"switch": "on"}),
    ("post", f"{PAGE}settings/", {"default": "deny", "opaque": ""}),
    ("post", f"{PAGE}{{pk}}/move/", {"direction": "down"}),
    ("post", f"{PAGE}{{pk}}/enabled/", {"enabled": "off"}),
    ("post", f"{PAGE}{{pk}}/delete/", {"post": "yes"}),
]


@pytest.mark.parametrize(("method", "url", "data"), ACTIONS)
@pytest.mark.parametrize("who", ["anonymous", "signed in, not staff"])
def test_only_staff_reach_the_policy_pages(
    client: Client, django_user_model: type[User], three_rules: None, method: str, url: str, data: dict[str, Any],
    who: str,
) -> None:  # fmt: skip
    if who != "anonymous":
        client.force_login(django_user_model.objects.create_user("visitor", password="pw-for-tests-123"))
    before, change = policy_document(), OneChange()
    response = getattr(client, method)(url.format(pk=row("first").pk), data)
    assert response.status_code == 302 and response["Location"].startswith("/admin/login/")
    assert policy_document() == before
    change.none()


def test_a_staff_user_without_the_policy_permissions_is_refused(client: Client, django_user_model: type[User],
                                                                 three_rules: None) -> None:  # fmt: skip
    client.force_login(django_user_model.objects.create_user("helper", password="pw-for-tests-123", is_staff=True))
    assert client.get(PAGE).status_code == 403
    assert client.post(f"{PAGE}{row('first').pk}/move/", {"direction": "down"}).status_code == 403
    assert 'id="task-policy"' not in client.get("/admin/").content.decode()
    assert rule_ids() == ["first", "second", "third"]


def test_an_action_is_a_post(admin_client: Client, three_rules: None) -> None:
    change = OneChange()
    assert admin_client.get(f"{PAGE}{row('third').pk}/move/?direction=up").status_code == 405
    assert admin_client.get(f"{PAGE}recommended/?switch=on").status_code == 405
    assert admin_client.post(f"{PAGE}{row('third').pk}/move/", {"direction": "sideways"}).status_code == 400
    assert admin_client.post(f"{PAGE}{row('third').pk}/enabled/", {"enabled": "maybe"}).status_code == 400
    assert admin_client.post(f"{PAGE}recommended/", {"switch": "toggle"}).status_code == 400
    assert admin_client.post(f"{PAGE}999999/move/", {"direction": "up"}).status_code == 404
    assert rule_ids() == ["first", "second", "third"]
    change.none()
