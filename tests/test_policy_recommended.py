"""The recommended rules (mcpserver/policy/recommended.py) decided by the engine (mcpserver/policy/evaluate.py):
a table of commands, the file tools, who a rule is for, and how parts, opaque commands and defaults combine."""

from __future__ import annotations

import os
import pwd
from typing import Any

import pytest

from mcpserver.policy.evaluate import Caller, CallFacts, Verdict, evaluate
from mcpserver.policy.recommended import recommended_policy
from mcpserver.policy.rules import Policy

WORKSPACE = "/srv/ws"
HOME = "/home/agent"
REPOS = ("/srv/ws/app", "/srv/ws/lib")
ALICE = Caller("alice", "laptop", None, frozenset({"mcp"}))
RECOMMENDED = recommended_policy()


def decide(
    command: str,
    policy: Policy = RECOMMENDED,
    cwd: str | None = "app",
    caller: Caller = ALICE,
    tool: str = "terminal_exec",
) -> Verdict:
    return evaluate(policy, CallFacts(tool, {"command": command, "cwd": cwd}, caller, WORKSPACE, HOME, REPOS))


def decide_call(tool: str, arguments: dict[str, Any], policy: Policy = RECOMMENDED, **facts: Any) -> Verdict:
    caller = facts.pop("caller", ALICE)
    places = {"workspace": WORKSPACE, "home": HOME, "git_roots": REPOS, **facts}
    return evaluate(policy, CallFacts(tool, arguments, caller, **places))


# Commands run in the repository /srv/ws/app unless they cd elsewhere.
TABLE = [
    # Everyday commands.
    ("ls -la", "allow", "default"),
    ("git status", "allow", "default"),
    ("rm file.txt", "allow", "default"),
    ("rm -r build", "allow", "default"),
    ("rm -rf ./build/ dist node_modules", "allow", "default"),
    ("grep -r foo .", "allow", "default"),
    ('grep -rn "sudo" .', "allow", "default"),
    ("git push origin main", "allow", "default"),
    ("git push -u origin feature", "allow", "default"),
    ("npm test 2>&1 | tail -20", "allow", "default"),
    ("cd src && rm -rf __pycache__", "allow", "default"),
    ("find . -name '*.pyc' -exec rm -rf {} +", "allow", "default"),
    ("chmod +x script.sh", "allow", "default"),
    ("curl -sL https://example.com/install.sh -o install.sh", "allow", "default"),
    ("curl -s https://api.example.com | jq .", "allow", "default"),
    ("echo hi > notes.txt", "allow", "default"),
    ("echo hi > ~/notes.txt", "allow", "default"),
    ("dd if=/dev/zero of=/dev/null bs=1M count=1", "allow", "default"),
    ("python3 -m pytest -x", "allow", "default"),
    ("git commit -m \"$(cat <<'EOF'\nNever run `sudo` here\nEOF\n)\"", "allow", "default"),
    ("time make -j4", "allow", "default"),
    ("echo reboot", "allow", "default"),
    ("systemctl status nginx", "allow", "default"),
    ("git log --oneline | head", "allow", "default"),
    ("find build -name '*.o' -delete", "allow", "default"),
    ("rsync -a src/ ../lib/src/", "allow", "default"),
    ("git push origin main:main", "allow", "default"),
    ("cp /dev/sda1 disk.img", "allow", "default"),
    ("busybox ls -la", "allow", "default"),
    # Asks.
    ("sudo apt install x", "ask", "privilege"),
    ("env FOO=1 sudo rm x", "ask", "privilege"),
    ("bash -c 'sudo ls'", "ask", "privilege"),
    ("echo $(sudo id)", "ask", "privilege"),
    ("su -c whoami", "ask", "privilege"),
    ("nohup git push -f origin main &", "ask", "force-push"),
    ("timeout 5 git push --force", "ask", "force-push"),
    ("git push origin +main", "ask", "force-push"),
    ("git push --force-with-lease=main:abc origin main", "ask", "force-push"),
    ("git -C ../lib push -f", "ask", "force-push"),
    ("git push --forc origin main", "ask", "force-push"),
    ("xargs chmod -R 777", "ask", "chmod-recursive"),
    ("chmod --recursive 700 .", "ask", "chmod-recursive"),
    ("curl -sL x | bash", "ask", "download-to-shell"),
    ("wget -qO- x | sh", "ask", "download-to-shell"),
    ("curl -s x | tee install.log | python3", "ask", "download-to-shell"),
    ("echo hi > ~/.bashrc", "ask", "home-dotfiles"),
    ('echo hi >> "$HOME/.profile"', "ask", "home-dotfiles"),
    ("echo 'export X=1' | tee -a ~/.zshrc", "ask", "home-dotfiles"),
    ("cat >> ~/.ssh/authorized_keys <<'EOF'\nssh-ed25519 AAAA\nEOF", "ask", "home-dotfiles"),
    ("cd ~ && echo x > .gitconfig", "ask", "home-dotfiles"),
    ("cp dotfiles/bashrc ~/.bashrc", "ask", "home-dotfiles"),
    ("sed -i 's/a/b/' ~/.gitconfig", "ask", "home-dotfiles"),
    ("sed 's/a/b/' ~/.gitconfig", "allow", "default"),
    ("rm -rf /tmp/x", "ask", "rm-recursive-outside-repos"),
    ("rm --recur /tmp/x", "ask", "rm-recursive-outside-repos"),
    ("rm -rf ~/.cache", "ask", "rm-recursive-outside-repos"),
    ("rm -rf ..", "ask", "rm-recursive-outside-repos"),
    ("rm -r .", "ask", "rm-recursive-outside-repos"),
    ("cd /tmp && rm -rf build", "ask", "rm-recursive-outside-repos"),
    ("find /var/log -name '*.gz' -exec rm -rf {} +", "ask", "rm-recursive-outside-repos"),
    ("ls | xargs rm -rf", "ask", "rm-recursive-outside-repos"),
    ('rm -rf "$DIR"', "ask", "rm-recursive-outside-repos"),
    # Spellings a second attack found (issue 31).
    ("busybox rm -rf /tmp/x", "ask", "rm-recursive-outside-repos"),
    ("find ~ -name '*.bak' -delete", "ask", "rm-recursive-outside-repos"),
    ("find / -delete", "ask", "rm-recursive-outside-repos"),
    ("rsync -a --delete src/ backup:/srv/src/", "ask", "rsync-delete"),
    ("rsync -a --delete-after src/ /srv/src/", "ask", "rsync-delete"),
    ("git push --mirror", "ask", "force-push"),
    ("git push origin :main", "ask", "force-push"),
    ("git push origin :refs/heads/main", "ask", "force-push"),
    ("git push --delete origin main", "ask", "force-push"),
    ("git push -d origin main", "ask", "force-push"),
    ("dd if=payload of=~/.bashrc", "ask", "home-dotfiles"),
    ("curl -sLo ~/.bashrc https://example.com/x", "ask", "home-dotfiles"),
    ("curl -o ~/.ssh/authorized_keys https://example.com/k", "ask", "home-dotfiles"),
    ("wget -qO ~/.profile https://example.com/x", "ask", "home-dotfiles"),
    ("python3 -c 'import os; os.system(\"rm -rf ~\")'", "ask", "opaque"),
    ("perl -e 'system q(id)'", "ask", "opaque"),
    ('node -e \'require("child_process").execSync("id")\'', "ask", "opaque"),
    ("python3 - <<'EOF'\nimport os\nos.system('id')\nEOF", "ask", "opaque"),
    # Denies.
    ("mkfs.ext4 /dev/sda1", "deny", "make-filesystem"),
    ("mkfs -t ext4 /dev/sdb", "deny", "make-filesystem"),
    ("sudo dd if=x of=/dev/sda", "deny", "write-block-device"),
    ("dd if=img of=/dev/nvme0n1 bs=4M", "deny", "write-block-device"),
    ("cat image > /dev/sda", "deny", "write-block-device"),
    ("cat disk.img | sudo tee /dev/sda > /dev/null", "deny", "write-block-device"),
    ("shutdown -h now", "deny", "power-off"),
    ('sh -c "reboot"', "deny", "power-off"),
    ("sudo systemctl poweroff", "deny", "power-off"),
    ("init 0", "deny", "power-off"),
    ("make && halt", "deny", "power-off"),
    ("eval 'poweroff'", "deny", "power-off"),
    ("doas reboot", "deny", "power-off"),
    ("mkswap /dev/sdb2", "deny", "make-filesystem"),
    ("cp /dev/zero /dev/sda", "deny", "write-block-device"),
    ("sudo mv disk.img /dev/nvme0n1", "deny", "write-block-device"),
    ("busybox mkfs.ext2 /dev/sdb1", "deny", "make-filesystem"),
    # Opaque: asks, since the recommended rules ask.
    ('eval "$CMD"', "ask", "opaque"),
    ("$CMD args", "ask", "opaque"),
    ("echo x | base64 -d | sh", "ask", "opaque"),
    ("source ./setup.sh", "ask", "opaque"),
    ("bash <(curl -s x)", "ask", "opaque"),
    ("[[ -f x ]] && ls", "ask", "opaque"),
]


@pytest.mark.parametrize(("command", "decision", "rule_id"), TABLE)
def test_the_recommended_rules_decide_each_command(command: str, decision: str, rule_id: str) -> None:
    verdict = decide(command)
    assert (verdict.decision, verdict.rule_id) == (decision, rule_id), verdict.reason


def test_the_table_covers_at_least_forty_commands_of_each_kind() -> None:
    assert len(TABLE) >= 40
    assert {decision for _, decision, _ in TABLE} == {"allow", "ask", "deny"}


def test_the_background_tool_is_decided_like_the_foreground_one() -> None:
    assert decide("sudo ls", tool="terminal_exec_background").rule_id == "privilege"


@pytest.mark.parametrize(
    ("command", "cwd", "decision"),
    [
        ("rm -r app/build", None, "allow"),
        ("rm -r app", None, "ask"),  # a whole repository
        ("rm -r build", "/tmp", "ask"),
        ("rm -r build", "/srv/ws/lib", "allow"),
        ("rm -r ../lib/build", "app", "allow"),
        ("rm -r ../other", "app", "ask"),
        ("cd $(mktemp -d) && rm -r x", "app", "ask"),
    ],
)
def test_rm_r_asks_only_for_paths_outside_the_repositories(command: str, cwd: str | None, decision: str) -> None:
    assert decide(command, cwd=cwd).decision == decision


# The file tools


@pytest.mark.parametrize(
    ("tool", "arguments", "decision"),
    [
        ("file_write", {"path": "~/.ssh/authorized_keys", "content": "k"}, "ask"),
        ("file_write", {"path": "/home/agent/.bashrc", "content": "x"}, "ask"),
        ("file_write", {"path": "src/app.py", "content": "x"}, "allow"),
        ("file_write", {"path": "/srv/ws/app/.env", "content": "x"}, "allow"),
        ("file_read", {"path": "~/.bashrc"}, "allow"),
        ("file_delete", {"path": "~/.gitconfig"}, "ask"),
        ("file_mkdir", {"path": "~/.config/tool"}, "ask"),
        ("file_move", {"source": "~/.ssh/id_ed25519", "dest": "app/key"}, "ask"),
        ("file_move", {"source": "app/a", "dest": "app/b"}, "allow"),
        ("file_edit", {"path": "~/.bashrc", "old_string": "a", "new_string": "b"}, "ask"),
        ("file_multi_edit", {"path": "~/.ssh/config", "edits": []}, "ask"),
        ("file_edit", {"path": "src/app.py", "old_string": "a", "new_string": "b"}, "allow"),
        ("file_grep", {"pattern": "x", "path": "~/.ssh"}, "allow"),
        ("file_list", {}, "allow"),
        ("git_status", {}, "allow"),
        ("workspace_info", {}, "allow"),
    ],
)
def test_the_recommended_rules_decide_file_tool_calls(tool: str, arguments: dict[str, Any], decision: str) -> None:
    assert decide_call(tool, arguments).decision == decision


def test_a_relative_path_is_in_the_home_when_the_workspace_is_the_home() -> None:
    verdict = decide_call("file_write", {"path": ".ssh/authorized_keys", "content": "k"}, workspace=HOME)
    assert (verdict.decision, verdict.rule_id) == ("ask", "home-dotfiles")


def test_a_path_that_is_not_a_string_is_matched_by_no_glob() -> None:
    assert decide_call("file_write", {"path": 3, "content": "x"}).decision == "allow"


# Who a rule is for


def who_policy(who: dict[str, Any]) -> Policy:
    return Policy.from_dict({"rules": [{"id": "for-some", "decision": "deny", "who": who, "commands": ["git push"]}]})


@pytest.mark.parametrize(
    ("who", "caller", "decision"),
    [
        ({"users": ["bob"]}, Caller("bob", "laptop"), "deny"),
        ({"users": ["bob"]}, Caller("alice", "laptop"), "allow"),
        ({"credentials": ["ci"]}, Caller("alice", "ci"), "deny"),
        ({"credentials": ["ci"]}, Caller("alice", "laptop"), "allow"),
        ({"clients": ["claude-ai"]}, Caller("alice", "Claude", "claude-ai"), "deny"),
        ({"clients": ["claude-ai"]}, Caller("alice", "laptop"), "allow"),
        ({"scopes": ["mcp"]}, Caller("alice", "t", None, frozenset({"mcp"})), "deny"),
        ({"scopes": ["mcp:read"]}, Caller("alice", "t", None, frozenset({"mcp"})), "allow"),
        ({"users": ["bob"], "scopes": ["mcp"]}, Caller("bob", "t", None, frozenset({"mcp:read"})), "allow"),
    ],
)
def test_a_rule_for_some_callers_does_not_catch_others(who: dict[str, Any], caller: Caller, decision: str) -> None:
    assert decide("git push origin main", who_policy(who), caller=caller).decision == decision


def test_a_rule_for_a_read_only_scope_is_about_read_only_callers_only() -> None:
    policy = Policy.from_dict(
        {"rules": [{"id": "secrets", "decision": "deny", "who": {"scopes": ["mcp:read"]}, "paths": ["secrets/**"]}]}
    )
    reader = Caller("carol", "viewer", None, frozenset({"mcp:read"}))
    assert decide_call("file_read", {"path": "secrets/key"}, policy, caller=reader).decision == "deny"
    assert decide_call("file_read", {"path": "secrets/key"}, policy).decision == "allow"
    assert decide_call("file_read", {"path": "docs/a"}, policy, caller=reader).decision == "allow"


# How parts, opaque commands and defaults combine


def policy_of(*rules: dict[str, Any], **settings: Any) -> Policy:
    return Policy.from_dict({"rules": list(rules), **settings})


def test_an_allow_rule_does_not_approve_a_command_chained_to_the_one_it_matches() -> None:
    policy = policy_of(
        {"id": "ls", "decision": "allow", "commands": ["ls"]}, {"id": "sudo", "decision": "ask", "commands": ["sudo"]}
    )
    assert decide("ls && sudo rm x", policy).rule_id == "sudo"


def test_the_first_rule_matching_a_command_decides_it() -> None:
    policy = policy_of(
        {"id": "push", "decision": "allow", "commands": ["git push"]},
        {"id": "force", "decision": "ask", "commands": ["git push --force"]},
    )
    assert decide("git push --force", policy).rule_id == "push"


def test_a_deny_rule_matching_a_visible_part_denies_an_opaque_command() -> None:
    verdict = decide('eval "$X"; mkfs /dev/sda')
    assert (verdict.decision, verdict.rule_id) == ("deny", "make-filesystem")


def test_an_allow_rule_cannot_approve_what_an_opaque_command_hides() -> None:
    policy = policy_of(
        {"id": "eval", "decision": "allow", "commands": ["eval"]},
        {"id": "sudo", "decision": "ask", "commands": ["sudo"]},
    )
    verdict = decide('eval "$X"', policy)
    assert (verdict.decision, verdict.rule_id) == ("ask", "opaque")
    assert "only known at run time" in verdict.reason


def test_an_opaque_command_gets_the_default_when_no_rule_asks() -> None:
    policy = policy_of({"id": "mkfs", "decision": "deny", "commands": ["mkfs"]})
    assert decide('eval "$X"', policy).decision == "allow"
    assert decide('eval "$X"', policy_of(opaque="deny")).decision == "deny"


def test_an_allow_list_policy_need_not_list_the_wrappers_that_only_run_a_command() -> None:
    policy = policy_of({"id": "git", "decision": "allow", "commands": ["git|ls"]}, default="deny")
    assert decide("timeout 60 nohup git fetch", policy).decision == "allow"
    assert decide("bash -c 'git status && ls'", policy).decision == "allow"
    assert decide("git status | grep x", policy).rule_id == "default"


def test_an_allow_list_policy_still_decides_sudo_itself() -> None:
    policy = policy_of({"id": "git", "decision": "allow", "commands": ["git"]}, default="deny")
    assert decide("sudo git status", policy).decision == "deny"


def test_a_rule_without_patterns_decides_every_command_of_its_callers() -> None:
    policy = policy_of({"id": "bob", "decision": "deny", "who": {"users": ["bob"]}, "tools": ["terminal_*"]})
    assert decide("ls", policy, caller=Caller("bob", "t")).rule_id == "bob"
    assert decide("ls", policy).rule_id == "default"


def test_a_command_that_is_not_a_string_is_opaque() -> None:
    facts = CallFacts("terminal_exec", {"command": ["rm", "-rf", "/"]}, ALICE, WORKSPACE, HOME, REPOS)
    verdict = evaluate(RECOMMENDED, facts)
    assert (verdict.decision, verdict.rule_id) == ("ask", "opaque")


def test_an_empty_command_is_decided_as_a_whole_call() -> None:
    assert decide("").rule_id == "default"


def test_a_verdict_names_the_command_its_rule_matched() -> None:
    verdict = decide("cd /tmp; sudo -u root rm -rf x")
    assert verdict.rule_id == "privilege"
    assert "sudo -u root rm -rf x" in verdict.reason
    assert "> ~/.bashrc" in decide("echo x > ~/.bashrc").reason


# `~name`: that user's home (issue 31: `~root/.bashrc` passed the dot-file rule)

ROOT_HOME = pwd.getpwnam("root").pw_dir


@pytest.mark.parametrize(
    "command",
    [
        "echo x > ~root/.bashrc",
        "echo x >> ~root/.ssh/authorized_keys",
        "cp evil ~root/.profile",
        "tee -a ~root/.bashrc",
        "cd ~root && echo x > .bashrc",
        "dd if=x of=~root/.bashrc",
        "echo x > ~/.bashrc",
        f"echo x > {ROOT_HOME}/.bashrc",
    ],
)
def test_a_users_home_spelt_with_their_name_is_that_home(command: str) -> None:
    verdict = decide_call("terminal_exec", {"command": command}, home=ROOT_HOME)
    assert (verdict.decision, verdict.rule_id) == ("ask", "home-dotfiles"), verdict.reason


def test_the_file_tools_resolve_a_users_home_by_name_too() -> None:
    verdict = decide_call("file_write", {"path": "~root/.bashrc", "content": "x"}, home=ROOT_HOME)
    assert (verdict.decision, verdict.rule_id) == ("ask", "home-dotfiles")
    me = pwd.getpwuid(os.getuid())
    mine = decide_call("file_edit", {"path": f"~{me.pw_name}/.gitconfig"}, home=me.pw_dir)
    assert (mine.decision, mine.rule_id) == ("ask", "home-dotfiles")


@pytest.mark.parametrize(
    ("tool", "arguments"),
    [
        ("terminal_exec", {"command": "echo x > ~no-such-user-31/.bashrc"}),
        ("terminal_exec", {"command": "cat ~no-such-user-31/notes"}),
        ("terminal_exec", {"command": "cp x ~+/y"}),
        ("file_write", {"path": "~no-such-user-31/.bashrc", "content": "x"}),
    ],
)
def test_a_tilde_naming_no_user_is_opaque(tool: str, arguments: dict[str, Any]) -> None:
    verdict = decide_call(tool, arguments)
    assert (verdict.decision, verdict.rule_id) == ("ask", "opaque")
    assert "names no user of this host" in verdict.reason
