"""The policy commands: `policy_export` writes the stored policy as JSON, `policy_load` replaces it with a document,
all or nothing; the two round-trip exactly, a bad document changes nothing and says why, and `--dry-run` only lists
what would change. The last tests run them as processes against the shared live server's database (a real exit
status, a real pipe)."""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from audit.models import AuditRecord
from mcpserver.models import PolicyRule
from mcpserver.policy_source import policy_document, policy_version, replace_policy
from tests.live import REPO, LiveServer

DOCUMENT: dict[str, Any] = {
    "default": "allow",
    "opaque": "ask",
    "rules": [
        {"id": "make-filesystem", "decision": "deny", "commands": ["mkfs|mkfs.*"]},
        {
            "id": "tree",
            "decision": "ask",
            "who": {"users": ["alice"], "scopes": ["mcp"]},
            "commands": [{"pattern": "rm -r", "when": "outside-repos"}],
            "description": "Trees outside repositories.",
            "approver": "user",
        },
        {"id": "reads", "decision": "allow", "tools": ["file_read"], "enabled": False},
    ],
}


def run(*args: str) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command(*args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def loaded_events() -> list[Any]:  # the records' detail
    return [record.detail for record in AuditRecord.objects.filter(event="policy.loaded").order_by("id")]


def write(path: Path, document: object) -> Path:
    path.write_text(json.dumps(document), encoding="utf-8")
    return path


# --- in this process ---------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_export_writes_the_stored_policy_as_indented_json(capsys: pytest.CaptureFixture[str]) -> None:
    replace_policy(DOCUMENT, by="test")
    out, err = run("policy_export")
    assert json.loads(out) == DOCUMENT == policy_document()
    assert out.startswith('{\n  "default": "allow",\n  "opaque": "ask",\n  "rules": [\n    {\n      "id": "make-')
    assert out.endswith("]\n}\n")
    assert err.strip() == "Exported 3 rules (default: allow) to standard output."


@pytest.mark.django_db
def test_export_then_load_round_trips_exactly(tmp_path: Path) -> None:
    replace_policy(DOCUMENT, by="test")
    first, _ = run("policy_export")
    exported = tmp_path / "policy.json"
    exported.write_text(first, encoding="utf-8")
    version = policy_version()
    out, _ = run("policy_load", str(exported))
    assert out.strip() == (
        f"Loaded 3 rules (2 enabled) from {exported}: policy version {version + 1} (no change but the version)."
    )
    again, _ = run("policy_export")
    assert again == first
    [loaded] = loaded_events()
    assert loaded["rule_ids"] == ["make-filesystem", "tree", "reads"] and loaded["version"] == version + 1
    assert loaded["sha256"] == hashlib.sha256(exported.read_bytes()).hexdigest()
    assert AuditRecord.objects.get(event="policy.loaded").credential_kind == "shell"


@pytest.mark.django_db
def test_load_replaces_the_rules_and_says_what_changed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    replace_policy({"rules": [{"id": "old", "decision": "deny", "commands": ["halt"]}, DOCUMENT["rules"][0]]}, "t")
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(json.dumps(DOCUMENT).encode())))
    out, _ = run("policy_load", "-")
    assert "from standard input" in out
    assert "(2 added, 1 removed, opaque automatic -> ask)" in out
    assert list(PolicyRule.objects.order_by("position").values_list("rule_id", "enabled")) == [
        ("make-filesystem", True),
        ("tree", True),
        ("reads", False),
    ]
    # The recommended set's id, with the admin's own patterns: the admin's rule, which switching the set off keeps.
    assert not PolicyRule.objects.get(rule_id="make-filesystem").recommended
    assert PolicyRule.objects.get(rule_id="tree").updated_by == "manage.py policy_load"


BAD_DOCUMENTS = [
    (b"{not json", "not a JSON document"),
    (b"\xff\xfe", "not a JSON document"),
    (json.dumps([1, 2]).encode(), "policy: must be an object"),
    (json.dumps({"rules": [{"id": "x", "decision": "deny", "comands": ["ls"]}]}).encode(), "unknown field 'comands'"),
    (json.dumps({"rules": [{"id": "x", "decision": "deny", "commands": ["rm 'a"]}]}).encode(), "commands[0]: cannot"),
    (json.dumps({"rules": [{"id": "x", "decision": "deny", "commands": ["rm [z-a]"]}]}).encode(), "bad character"),
    (json.dumps({"rules": [{"id": "x", "decision": "deny"}, {"id": "x", "decision": "ask"}]}).encode(), "already"),
    (json.dumps({"rules": [{"id": "x", "decision": "deny", "enabled": "no"}]}).encode(), "enabled: must be true"),
    (json.dumps({"default": "maybe"}).encode(), "policy: default: must be one of allow, ask, deny"),
]


@pytest.mark.django_db
@pytest.mark.parametrize(("data", "reason"), BAD_DOCUMENTS)
def test_a_bad_document_changes_nothing_and_says_why(tmp_path: Path, data: bytes, reason: str) -> None:
    replace_policy(DOCUMENT, by="test")
    before, version = policy_document(), policy_version()
    path = tmp_path / "bad.json"
    path.write_bytes(data)
    with pytest.raises(CommandError) as raised:
        run("policy_load", str(path))
    assert reason in str(raised.value) and "nothing was changed" in str(raised.value)
    assert policy_document() == before and policy_version() == version and loaded_events() == []


@pytest.mark.django_db
def test_a_missing_file_is_an_error() -> None:
    with pytest.raises(CommandError, match="cannot read /nonexistent/policy.json: No such file"):
        run("policy_load", "/nonexistent/policy.json")


@pytest.mark.django_db
def test_a_dry_run_lists_the_changes_and_writes_nothing(tmp_path: Path) -> None:
    old = [
        {"id": "old", "decision": "deny", "commands": ["halt"]},
        {"id": "tree", "decision": "ask", "commands": ["rm"]},
    ]
    replace_policy({"rules": old}, "t")
    before, version = policy_document(), policy_version()
    changed = json.loads(json.dumps(DOCUMENT))
    changed["default"] = "ask"
    out, _ = run("policy_load", "--dry-run", str(write(tmp_path / "p.json", changed)))
    assert out.splitlines() == [
        "  would add rule make-filesystem",
        "  would add rule reads",
        "  would remove rule old",
        "  would change rule tree",
        "  would change the default allow -> ask",
        "  would change the opaque automatic -> ask",
        f"Dry run: {tmp_path / 'p.json'} holds 3 rules (2 enabled) (2 added, 1 removed, 1 changed, default allow -> "
        "ask, opaque automatic -> ask); nothing was changed.",
    ]
    assert policy_document() == before and policy_version() == version and loaded_events() == []
    same, _ = run("policy_load", "--dry-run", str(write(tmp_path / "same.json", before)))
    assert same.strip().endswith("(the same as the stored policy); nothing was changed.")


@pytest.mark.django_db
def test_a_dry_run_notices_a_new_order(tmp_path: Path) -> None:
    replace_policy(DOCUMENT, by="test")
    reordered = {**DOCUMENT, "rules": list(reversed(DOCUMENT["rules"]))}
    out, _ = run("policy_load", "--dry-run", str(write(tmp_path / "p.json", reordered)))
    assert out.splitlines()[0] == "  would reorder the rules" and "(reordered)" in out


@pytest.mark.django_db
def test_export_refuses_to_overwrite_a_file_unless_forced(tmp_path: Path) -> None:
    replace_policy(DOCUMENT, by="test")
    target = tmp_path / "policy.json"
    target.write_text("keep me", encoding="utf-8")
    with pytest.raises(CommandError, match="exists; nothing was written"):
        run("policy_export", str(target))
    assert target.read_text(encoding="utf-8") == "keep me"
    _, err = run("policy_export", "--force", str(target))
    assert json.loads(target.read_text(encoding="utf-8")) == DOCUMENT
    assert err.strip() == f"Exported 3 rules (default: allow) to {target}."
    fresh = tmp_path / "fresh.json"
    run("policy_export", str(fresh))
    assert fresh.read_text(encoding="utf-8") == target.read_text(encoding="utf-8")


# --- as processes, against the live server's database ------------------------------------------------------------


def manage(server: LiveServer, script: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    """`script` in bash with `manage` standing for this interpreter's manage.py, in the server's environment."""
    return subprocess.run(
        ["bash", "-c", f"set -o pipefail; manage() {{ {sys.executable} manage.py \"$@\"; }}; {script}"],
        cwd=REPO, env=server.env, input=stdin, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


@pytest.mark.live
def test_export_piped_into_load_changes_nothing_but_the_version(live_server: LiveServer) -> None:
    piped = manage(live_server, "manage policy_export | manage policy_load -")
    assert piped.returncode == 0, piped.stderr
    assert "from standard input: policy version" in piped.stdout and "(no change but the version)" in piped.stdout


@pytest.mark.live
def test_a_bad_document_exits_non_zero_with_the_reason_on_stderr(live_server: LiveServer) -> None:
    bad = json.dumps({"rules": [{"id": "x", "decision": "deny", "commands": ["git push |"]}]})
    result = manage(live_server, "manage policy_load -", stdin=bad)
    assert result.returncode == 1 and result.stdout == ""
    assert "rules[0] ('x'): commands[0]: 'git push |': each side of a `|` needs a command" in result.stderr
    assert "nothing was changed" in result.stderr and "Traceback" not in result.stderr
