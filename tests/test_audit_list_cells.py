"""The call list answers "why", through Django's test client: a failed call's first line of error in a column of its
own, the agent's description of a command under it (marked as the agent's words), both escaped with hidden
characters spelled out, and the filter bar's exit codes. How the list fits 1280 px is
tests/test_audit_list_browser.py's; the exit-code filter's rows, exports and `audit_export` are
tests/test_audit_filters.py's."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.test import Client

from audit.log import call_denied, call_finished, call_started
from audit.models import AuditRecord
from audit.why import WHY_CHARS, failure_line
from tests.test_audit_admin import CHANGELIST, actor, make_call

pytestmark = pytest.mark.django_db

EXEC_FAILED = "stdout:\nBuilding…\n\nstderr:\nmake: *** No rule to make target 'deploy'.  Stop.\nmore\n\nexit_code: 2"


def finished(outcome: str, result: str, reason: str = "") -> AuditRecord:
    return AuditRecord(kind="call.finished", outcome=outcome, result_excerpt=result, reason=reason)


@pytest.mark.parametrize(
    ("outcome", "result", "reason", "line"),
    [
        ("error", EXEC_FAILED, "", "make: *** No rule to make target 'deploy'. Stop."),  # stderr first
        (
            "error",
            "stdout:\n\nFAILED tests/test_app.py::test_one\nmore\n\nexit_code: 1",
            "",
            "FAILED tests/test_app.py::test_one",
        ),
        ("error", "stderr:\n  \nfatal: not a git repository\n\nexit_code: 128", "", "fatal: not a git repository"),
        ("error", "exit_code: 1", "", "exit_code: 1"),  # printed nothing
        ("error", "Error: no such file: notes.txt\nhint", "", "Error: no such file: notes.txt"),
        ("timeout", "Error: timed out after 30 s", "", "Error: timed out after 30 s"),
        ("denied", "read-only token", "read-only token", "read-only token"),
        ("interrupted", "ignored", "the server stopped\nwhile it ran", "the server stopped"),  # the reason first
        ("error", "line one\r\nline two", "", "line one"),  # CRLF ends a line
        ("error", "safe\rrm -rf ~", "", "safe⟪U+000D⟫rm -rf ~"),  # a lone CR would hide what comes before it
        ("error", "exe.\u202etxt\x1b[31m", "", "exe.⟪U+202E⟫txt⟪U+001B⟫[31m"),
        ("ok", EXEC_FAILED, "", ""),
        ("pending", "waiting for approval", "", ""),
    ],
)
def test_the_first_line_of_a_failed_calls_error_says_why(outcome: str, result: str, reason: str, line: str) -> None:
    assert failure_line(finished(outcome, result, reason)) == line


def test_a_call_that_has_not_finished_has_no_why() -> None:
    assert failure_line(None) == ""


def test_a_long_error_line_is_cut_never_inside_a_spelled_out_character() -> None:
    shown = failure_line(finished("error", "x" * (WHY_CHARS - 3) + "\u202e and more"))
    assert len(shown) <= WHY_CHARS and shown.endswith("…") and "⟪" not in shown


def cells(content: str, column: str) -> list[str]:
    """The HTML inside each row's cell of `column`, newest call first."""
    return re.findall(rf'<td class="field-{column}">(.*?)</td>', content, re.S)


def test_the_list_shows_why_a_failed_call_failed_escaped(admin_client: Client) -> None:
    make_call(arguments={"command": "make deploy"}, outcome="error", result=EXEC_FAILED, exit_code=2)
    make_call(arguments={"command": "cat page.html"}, outcome="error", result="<script>alert(1)</script>\nsecond")
    call_denied(actor(), "file_delete", {"path": "/etc/passwd"}, "outside the <b>workspace</b>", "test-instance")
    make_call(arguments={"command": "echo fine"}, outcome="ok", result="stdout:\nfine\n\nexit_code: 0")
    make_call(arguments={"command": "sleep 100"}, outcome=None)
    content = admin_client.get(CHANGELIST).content.decode()
    assert re.search(r'<th scope="col" class="column-call_failure">\s*<div class="text"><span>Why it failed<', content)
    assert cells(content, "call_failure") == [
        "",  # still running
        "",  # ok
        "outside the &lt;b&gt;workspace&lt;/b&gt;",
        "&lt;script&gt;alert(1)&lt;/script&gt;",
        "make: *** No rule to make target &#x27;deploy&#x27;. Stop.",
    ]
    assert "<script>alert" not in content and "<b>workspace" not in content


def test_the_agents_description_is_shown_under_its_command_as_its_words(admin_client: Client) -> None:
    hostile = "Run the tests <script>alert(1)</script>\u202e\nsecond line"
    make_call(arguments={"command": "pytest -q", "description": hostile})
    make_call("terminal_exec_background", {"command": "npm run dev", "description": "Start the dev server"})
    make_call(arguments={"command": "ls", "description": "x" * 600})
    make_call(arguments={"command": "true", "description": 5})  # not a string: no description
    make_call(arguments={"command": "date"})  # the argument is optional
    shown = cells(admin_client.get(CHANGELIST).content.decode(), "arguments_summary")
    said = '<span class="agent-says audit-described"><span class="agent-says-label">agent says:</span> {}</span>'
    assert shown[:2] == ["date", "true"]
    assert shown[2] == "ls" + said.format("x" * 119 + "…")  # cut for the list; the call's page shows more
    assert shown[3] == "npm run dev" + said.format("Start the dev server")
    assert shown[4] == "pytest -q" + said.format(
        "Run the tests &lt;script&gt;alert(1)&lt;/script&gt;⟪U+202E⟫ second line"
    )


@pytest.mark.parametrize(
    ("query", "chips"),
    [
        ("", {"any": ("?", True), "nonzero": ("?exit_code=nonzero", False), "127": ("?exit_code=127", False)}),
        (
            "tool=terminal_exec&exit_code=1",
            {
                "any": ("?tool=terminal_exec", False),
                "1": ("?tool=terminal_exec", True),  # toggled out
                "127": ("?tool=terminal_exec&exit_code=1&exit_code=127", False),  # one more
            },
        ),
        ("exit_code=3", {"3": ("?", True), "0": ("?exit_code=3&exit_code=0", False)}),  # a code not offered
    ],
)
def test_the_filter_bar_toggles_exit_codes_and_takes_any_other(
    admin_client: Client, query: str, chips: dict[str, tuple[str, bool]]
) -> None:
    content = admin_client.get(f"{CHANGELIST}?{query}").content.decode()
    row = re.search(r'<div class="audit-filter-row" id="audit-filter-exit-code">(.*?)</div>', content, re.S)
    assert row is not None
    links = {
        label: (href.replace("&amp;", "&"), "active" in css)
        for css, href, label in re.findall(r'<a class="audit-chip([^"]*)" href="([^"]*)"[^>]*>([^<]*)</a>', row[1])
    }
    for label, expected in chips.items():
        assert links[label] == expected, label
    form = re.search(r'<form method="get" class="audit-exit-code" id="audit-exit-code-form">(.*?)</form>', row[1], re.S)
    assert form is not None and 'type="number" id="audit-exit-code" name="exit_code"' in form[1]
    hidden = re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', form[1])
    assert hidden == [(name, value) for name, value in (part.split("=") for part in query.split("&") if part)]


def test_an_exit_code_filter_in_use_is_listed_and_removable(admin_client: Client) -> None:
    content = admin_client.get(f"{CHANGELIST}?exit_code=127&exit_code=nonzero").content.decode()
    active = re.search(r'id="audit-filter-active">(.*?)</div>', content, re.S)
    assert active is not None and "exit_code: 127" in active[1] and 'href="?exit_code=nonzero"' in active[1]


def test_the_exit_code_filter_narrows_the_list(admin_client: Client) -> None:
    calls: dict[str, Any] = {
        "ok": make_call(arguments={"command": "true"}, exit_code=0),
        "missing": make_call(
            arguments={"command": "nope"}, outcome="error", result="stderr:\nnope: not found", exit_code=127
        ),
        "failed": make_call(arguments={"command": "false"}, outcome="error", exit_code=1),
    }
    started = call_started(actor(), "file_read", {"path": "a"}, "test-instance")
    call_finished(started, "ok", result_text="text", exit_code=None)

    def listed(query: str) -> set[str]:
        response = admin_client.get(f"{CHANGELIST}?{query}")
        names = {record.pk: name for name, record in calls.items()}
        return {names.get(record.pk, "read") for record in response.context["cl"].result_list}

    assert listed("exit_code=127") == {"missing"}
    assert listed("exit_code=nonzero") == {"missing", "failed"}
    assert listed("exit_code=0&exit_code=1") == {"ok", "failed"}
    assert listed("") == {"ok", "missing", "failed", "read"}
    assert admin_client.get(f"{CHANGELIST}?exit_code=abc").status_code == 400
