"""Who may answer an ask (mcpserver/policy/evaluate.py): a call's approver is the strictest of its parts, so a
client's own user answers a call only when every part that asks lets them (issue 31: `uname -m; sudo -n id`
was answered by the client's accept alone)."""

from __future__ import annotations

import pytest

from mcpserver.policy.evaluate import Caller, CallFacts, Verdict, evaluate
from mcpserver.policy.recommended import RECOMMENDED
from mcpserver.policy.rules import Policy

ALICE = Caller("alice", "laptop", None, frozenset({"mcp"}))
USER_MAY_APPROVE = {"id": "uname", "decision": "ask", "commands": ["uname"], "approver": "user"}
USER_WRITES = {"id": "user-writes", "decision": "ask", "tools": ["file_write"], "approver": "user"}
POLICY = Policy.from_dict({"rules": [USER_MAY_APPROVE, USER_WRITES, *RECOMMENDED]})


def decide(command: str, policy: Policy = POLICY) -> Verdict:
    facts = CallFacts("terminal_exec", {"command": command}, ALICE, "/srv/ws", "/home/agent", ("/srv/ws/app",))
    return evaluate(policy, facts)


@pytest.mark.parametrize(
    ("command", "rule_id"),
    [
        ("uname -m; sudo -n id; touch M", "privilege"),
        ("sudo -n id; uname -m", "privilege"),
        ("uname -m && rm -rf /tmp/x", "rm-recursive-outside-repos"),
        ("uname -m; git push --force origin main", "force-push"),
        ("uname -m > ~/.bashrc", "home-dotfiles"),
        ("uname -m; echo x >> ~/.profile", "home-dotfiles"),
        ('uname -m; eval "$X"', "opaque"),
    ],
)
def test_a_part_that_needs_staff_makes_the_whole_call_need_staff(command: str, rule_id: str) -> None:
    verdict = decide(command)
    assert (verdict.decision, verdict.rule_id, verdict.approver) == ("ask", rule_id, "staff"), verdict.reason
    assert rule_id in verdict.reason or "opaque" in verdict.reason


def test_the_clients_user_answers_when_every_part_that_asks_lets_them() -> None:
    verdict = decide("uname -m; ls; uname -a")
    assert (verdict.decision, verdict.rule_id, verdict.approver) == ("ask", "uname", "user")


def test_a_default_of_ask_needs_staff_whatever_the_users_rule_says() -> None:
    policy = Policy.from_dict({"default": "ask", "rules": [USER_MAY_APPROVE]})
    assert decide("uname -m", policy).approver == "user"
    verdict = decide("uname -m; touch M", policy)
    assert (verdict.rule_id, verdict.approver) == ("default", "staff")


def test_a_deny_or_an_allow_has_no_one_to_answer() -> None:
    assert decide("uname -m; shutdown -h now").approver == "staff"
    assert decide("ls").approver == "staff"


def test_a_file_tools_call_takes_the_approver_of_its_strictest_path() -> None:
    facts = CallFacts("file_write", {"path": "notes.txt", "content": "x"}, ALICE, "/srv/ws", "/home/agent")
    assert evaluate(POLICY, facts).approver == "user"
    dotfile = CallFacts("file_write", {"path": "~/.bashrc", "content": "x"}, ALICE, "/srv/ws", "/home/agent")
    verdict = evaluate(POLICY, dotfile)
    assert (verdict.rule_id, verdict.approver) == ("home-dotfiles", "staff")
