"""The command policy on apply_patch (mcpserver/policy/evaluate.py): every path the patch names is a part of the call,
read by the executor's own parser, so a rule about any of them decides the whole patch and the strictest approver
answers it."""

from __future__ import annotations

from typing import Any

from mcpserver.policy.evaluate import Caller, CallFacts, Verdict, evaluate
from mcpserver.policy.recommended import RECOMMENDED
from mcpserver.policy.rules import Policy, Rule

ALICE = Caller("alice", "laptop", None, frozenset({"mcp"}))
WORKSPACE, HOME = "/srv/ws", "/home/agent"
NO_SECRETS = {"id": "no-secrets", "decision": "deny", "paths": ["secrets/**"]}
USER_DOCS = {"id": "user-docs", "decision": "ask", "tools": ["apply_patch"], "paths": ["docs/**"], "approver": "user"}


def patch(*lines: str) -> str:
    return "\n".join(["*** Begin Patch", *lines, "*** End Patch"])


def decide(text: Any, *rules: dict[str, Any], **settings: Any) -> Verdict:
    policy = Policy.from_dict({"rules": list(rules), **settings})
    return evaluate(policy, CallFacts("apply_patch", {"input": text}, ALICE, WORKSPACE, HOME))


def test_a_path_rule_denies_the_whole_patch_when_any_of_its_paths_matches() -> None:
    text = patch("*** Add File: ok.txt", "+x", "*** Update File: secrets/key.txt", "-a", "+b")
    verdict = decide(text, NO_SECRETS)
    assert (verdict.decision, verdict.rule_id) == ("deny", "no-secrets")
    assert verdict.reason == "rule 'no-secrets' matched path '/srv/ws/secrets/key.txt'"
    assert decide(patch("*** Add File: ok.txt", "+x"), NO_SECRETS).decision == "allow"


def test_a_move_destination_and_an_absolute_path_are_parts_too() -> None:
    moved = patch("*** Update File: notes.txt", "*** Move to: secrets/notes.txt")
    assert decide(moved, NO_SECRETS).rule_id == "no-secrets"
    absolute = patch("*** Delete File: /srv/ws/secrets/old.key")
    assert decide(absolute, NO_SECRETS).rule_id == "no-secrets"


def test_the_strictest_approver_of_its_paths_answers_the_patch() -> None:
    docs = patch("*** Add File: docs/a.md", "+a", "*** Update File: docs/b.md", "-b", "+B")
    verdict = decide(docs, USER_DOCS, *RECOMMENDED)
    assert (verdict.decision, verdict.rule_id, verdict.approver) == ("ask", "user-docs", "user")
    with_dotfile = patch("*** Add File: docs/a.md", "+a", "*** Add File: ~/.bashrc", "+alias ls=rm")
    verdict = decide(with_dotfile, USER_DOCS, *RECOMMENDED)
    assert (verdict.decision, verdict.rule_id, verdict.approver) == ("ask", "home-dotfiles", "staff")


def test_a_rule_about_whole_calls_of_apply_patch_decides_every_patch() -> None:
    rule = {"id": "no-patches", "decision": "deny", "tools": ["apply_patch"]}
    assert decide(patch("*** Add File: a.txt", "+a"), rule).rule_id == "no-patches"
    assert decide("not a patch", rule).rule_id == "no-patches"


def test_a_patch_that_cannot_be_read_changes_nothing_so_only_its_whole_call_is_decided() -> None:
    assert decide("*** Begin Patch\n*** Add File: secrets/k\n+k", NO_SECRETS).rule_id == "default"
    assert decide(42, NO_SECRETS).rule_id == "default"


def test_a_path_rule_without_tools_covers_apply_patch_and_a_glob_may_name_it() -> None:
    assert Rule.from_dict(NO_SECRETS).covers("apply_patch")
    assert Rule.from_dict({"id": "p", "decision": "ask", "tools": ["apply_*"]}).covers("apply_patch")
