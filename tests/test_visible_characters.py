"""Control and bidirectional characters that agents, repositories and clients choose reach operators visibly: spelled
out as code points in CSV cells (the admin's download and `audit_export`), escaped in JSON Lines without losing the
value, and spelled out on every HTML page the site serves."""

from __future__ import annotations

import csv
import io
import json
from io import StringIO

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.http import StreamingHttpResponse
from django.test import Client
from oauth2_provider.models import Application

from audit.visible import make_visible, make_visible_in_html
from oauth.tokens import issue_token
from tests.test_audit_admin import EXPORT_CSV, EXPORT_JSONL, make_call, stream

pytestmark = pytest.mark.django_db

RLO = "\u202e"  # RIGHT-TO-LEFT OVERRIDE: "exe.txt" shown after it reads "txt.exe"
ESC = "\x1b"
# Clears an operator's terminal, moves to the start of the line and overwrites it, sets the window title.
TERMINAL_TRICKS = f"{ESC}[2J{ESC}]0;owned\x07\rrm -rf / # looks harmless"
COMMAND = f"echo {RLO}exe.txt; printf '{TERMINAL_TRICKS}'"
RAW = (ESC, "\r", "\x07", RLO, "\u2066", "\x85")


def no_raw_characters(text: str) -> bool:
    return not any(character in text for character in RAW)


def test_make_visible_spells_out_controls_and_bidi_but_keeps_layout() -> None:
    assert make_visible(f"a{RLO}b{ESC}c\rd\x7fe\x85f\u2066g\u200fh") == (
        "a⟪U+202E⟫b⟪U+001B⟫c⟪U+000D⟫d⟪U+007F⟫e⟪U+0085⟫f⟪U+2066⟫g⟪U+200F⟫h"
    )
    assert make_visible("line one\n\tline two é 😀") == "line one\n\tline two é 😀"


def test_html_keeps_crlf_which_form_line_breaks_are_made_of_but_spells_out_a_lone_cr() -> None:
    assert make_visible_in_html("<textarea>a\r\nb</textarea>") == "<textarea>a\r\nb</textarea>"
    assert make_visible_in_html("<td>safe\rrm -rf ~</td>") == "<td>safe⟪U+000D⟫rm -rf ~</td>"
    assert make_visible_in_html(f"<td>{RLO}{ESC}</td>") == "<td>⟪U+202E⟫⟪U+001B⟫</td>"


def download(client: Client, url: str) -> str:
    response = client.get(url)
    assert isinstance(response, StreamingHttpResponse)
    return stream(response)


def test_the_csv_download_spells_out_what_a_command_and_its_output_hid(admin_client: Client) -> None:
    make_call(arguments={"command": COMMAND}, result=f"{TERMINAL_TRICKS}\nsecond line")
    body = download(admin_client, EXPORT_CSV)
    assert no_raw_characters(body.replace("\r\n", "\n"))  # the CSV's own line ends are CRLF
    [row] = list(csv.DictReader(io.StringIO(body)))
    assert (
        row["command"]
        == "echo ⟪U+202E⟫exe.txt; printf '⟪U+001B⟫[2J⟪U+001B⟫]0;owned⟪U+0007⟫⟪U+000D⟫rm -rf / # looks harmless'"
    )
    assert row["result_excerpt"].endswith("⟪U+000D⟫rm -rf / # looks harmless\nsecond line")
    assert "⟪U+202E⟫exe.txt" in row["arguments"]


def test_audit_export_csv_spells_them_out_for_the_terminal_it_is_printed_on() -> None:
    make_call(arguments={"command": COMMAND}, result=TERMINAL_TRICKS)
    out = StringIO()
    call_command("audit_export", "--format", "csv", stdout=out)
    text = out.getvalue()
    assert no_raw_characters(text.replace("\r\n", "\n"))
    assert "⟪U+001B⟫[2J" in text and "echo ⟪U+202E⟫exe.txt" in text


def test_the_jsonl_export_escapes_them_and_keeps_the_exact_value(admin_client: Client) -> None:
    make_call(arguments={"command": COMMAND}, result=f"{TERMINAL_TRICKS}\x85")
    body = download(admin_client, EXPORT_JSONL)
    assert no_raw_characters(body)
    [row] = [json.loads(line) for line in body.splitlines()]
    assert row["arguments"] == {"command": COMMAND}
    assert row["result_excerpt"] == f"{TERMINAL_TRICKS}\x85"
    out = StringIO()
    call_command("audit_export", "--format", "jsonl", stdout=out)
    assert no_raw_characters(out.getvalue()) and json.loads(out.getvalue())["arguments"] == {"command": COMMAND}


def test_the_audit_list_and_the_call_page_spell_them_out(admin_client: Client) -> None:
    started = make_call(arguments={"command": COMMAND}, result=TERMINAL_TRICKS)
    for url in ("/admin/audit/auditrecord/", f"/admin/audit/auditrecord/{started.id}/change/"):
        page = admin_client.get(url)
        assert page.status_code == 200
        html = page.content.decode()
        assert no_raw_characters(html), url
        assert "⟪U+202E⟫exe.txt" in html, url


def test_names_chosen_by_clients_and_admins_are_spelled_out_on_their_pages(admin_client: Client) -> None:
    user = User.objects.get(username="admin")
    Application.objects.create(
        name=f"Claude{RLO}gnp.exe", client_type="public", authorization_grant_type="authorization-code",
        redirect_uris="http://127.0.0.1/cb", user=None,
    )  # fmt: skip
    issue_token(user, f"laptop{RLO}")
    for url in ("/admin/oauth/connectedapp/", "/admin/oauth/bearertoken/"):
        page = admin_client.get(url)
        assert page.status_code == 200, url
        html = page.content.decode()
        assert RLO not in html, url
        assert "⟪U+202E⟫" in html, url
