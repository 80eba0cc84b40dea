"""Policy rules as data (mcpserver/policy/rules.py): validation that names the rule and field, the round trip to
JSON, and the globs and patterns rules are made of."""

from __future__ import annotations

import json
from typing import Any

import pytest

from mcpserver.policy.paths import PathGlob, Places, glob_regex
from mcpserver.policy.patterns import CommandPattern, PatternError
from mcpserver.policy.recommended import RECOMMENDED, recommended_policy
from mcpserver.policy.rules import SCOPES, TOOL_NAMES, Policy, PolicyError, Rule, Who
from mcpserver.policy.scene import Scene
from mcpserver.policy.shell import parse_command

FULL_POLICY: dict[str, Any] = {
    "default": "deny",
    "opaque": "deny",
    "rules": [
        {
            "id": "bob-reads",
            "decision": "allow",
            "who": {"users": ["bob"], "credentials": ["laptop"], "clients": ["client-1"], "scopes": ["mcp:read"]},
            "tools": ["file_read", "git_*"],
            "description": "Bob may look.",
        },
        {
            "id": "rm-outside",
            "decision": "ask",
            "commands": ["git push -f|--force", {"pattern": "rm -r", "when": "outside-repos"}],
        },
        {"id": "keys", "decision": "deny", "tools": ["file_*"], "paths": ["~/.ssh/**", "/etc/**"]},
    ],
}


def error_of(data: object) -> str:
    with pytest.raises(PolicyError) as raised:
        Policy.from_dict(data)
    return str(raised.value)


def rule(**fields: Any) -> dict[str, Any]:
    return {"id": "r", "decision": "ask", **fields}


# The round trip


def test_a_policy_survives_the_round_trip_through_json() -> None:
    policy = Policy.from_dict(FULL_POLICY)
    data = json.loads(json.dumps(policy.to_dict()))
    assert data == FULL_POLICY
    assert Policy.from_dict(data) == policy


def test_the_recommended_rules_survive_the_round_trip() -> None:
    policy = recommended_policy()
    again = Policy.from_dict(json.loads(json.dumps(policy.to_dict())))
    assert again == policy
    assert [rule["id"] for rule in again.to_dict()["rules"]] == [rule["id"] for rule in RECOMMENDED]


def test_a_rule_leaves_out_what_it_does_not_set() -> None:
    assert Rule.from_dict({"id": "x", "decision": "deny"}).to_dict() == {"id": "x", "decision": "deny"}


def test_an_empty_policy_allows_as_today() -> None:
    policy = Policy.from_dict({})
    assert (policy.rules, policy.default, policy.opaque_decision) == ((), "allow", "allow")


def test_the_opaque_decision_asks_when_a_rule_asks_unless_set() -> None:
    asking = Policy.from_dict({"default": "allow", "rules": [rule(commands=["sudo"])]})
    denying = Policy.from_dict({"default": "allow", "rules": [rule(decision="deny", commands=["sudo"])]})
    assert asking.opaque_decision == "ask"
    assert denying.opaque_decision == "allow"
    assert Policy.from_dict({"opaque": "deny", "rules": [rule(commands=["sudo"])]}).opaque_decision == "deny"


# Validation names the rule and the field


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ([], "policy: must be an object"),
        ({"rule": []}, "policy: unknown field 'rule'"),
        ({"rules": {}}, "policy: rules: must be a list"),
        ({"default": "maybe"}, "policy: default: must be one of allow, ask, deny"),
        ({"opaque": "yes"}, "policy: opaque: must be one of"),
        ({"rules": ["sudo"]}, "rules[0]: must be an object"),
        ({"rules": [{"decision": "ask"}]}, "rules[0]: id: needs 1 to 64"),
        ({"rules": [rule(id="bad id")]}, "rules[0] ('bad id'): id:"),
        ({"rules": [rule(id="x" * 65)]}, "id: needs 1 to 64"),
        ({"rules": [rule(id="default")]}, "rules[0] ('default'): id: 'default' is what verdicts name"),
        ({"rules": [rule(), rule()]}, "rules[1] ('r'): id: already used by rules[0]"),
        ({"rules": [rule(decision="block")]}, "rules[0] ('r'): decision: must be one of allow, ask, deny"),
        ({"rules": [rule(paths=["~/[z-a]"])]}, "rules[0] ('r'): paths[0]: '[z-a]' is not a glob"),
        ({"rules": [rule(tools=["file_[z-a]"])]}, "tools[0]: 'file_[z-a]' is not a glob"),
        ({"rules": [rule(commands=["rm [z-a]"])]}, "commands[0]: '[z-a]' is not a glob"),
        ({"rules": [rule(approver="admin")]}, "rules[0] ('r'): approver: must be one of staff, user"),
        ({"rules": [rule(decision="deny", approver="user")]}, "approver: only an ask rule has approvers"),
        ({"rules": [rule(command=["sudo"])]}, "rules[0] ('r'): unknown field 'command'"),
        ({"rules": [rule(who="bob")]}, "rules[0] ('r'): who: must be an object"),
        ({"rules": [rule(who={"user": ["bob"]})]}, "rules[0] ('r'): who: unknown field 'user'"),
        ({"rules": [rule(who={"users": []})]}, "rules[0] ('r'): who.users: must be a non-empty list"),
        ({"rules": [rule(who={"users": [""]})]}, "rules[0] ('r'): who.users[0]: must be a non-empty string"),
        ({"rules": [rule(who={"scopes": ["admin"]})]}, "rules[0] ('r'): who.scopes: unknown scope 'admin'"),
        ({"rules": [rule(tools="terminal_exec")]}, "rules[0] ('r'): tools: must be a non-empty list"),
        ({"rules": [rule(tools=["terminal_exce"])]}, "rules[0] ('r'): tools[0]: 'terminal_exce' names no tool"),
        ({"rules": [rule(commands=[])]}, "rules[0] ('r'): commands: must be a non-empty list"),
        ({"rules": [rule(commands=[""])]}, "rules[0] ('r'): commands[0]: a pattern must be a non-empty string"),
        ({"rules": [rule(commands=[3])]}, "rules[0] ('r'): commands[0]: a pattern must be a non-empty string"),
        ({"rules": [rule(commands=["ls", "echo 'x"])]}, "rules[0] ('r'): commands[1]: cannot read"),
        ({"rules": [rule(commands=["curl |"])]}, "rules[0] ('r'): commands[0]: 'curl |': each side of a `|`"),
        ({"rules": [rule(commands=["/bin/rm"])]}, "rules[0] ('r'): commands[0]: '/bin/rm': a command is matched"),
        ({"rules": [rule(commands=["rm -r|x"])]}, "commands[0]: '-r|x': alternatives of an option"),
        ({"rules": [rule(commands=["rm a||b"])]}, "commands[0]: 'a||b': an empty alternative"),
        ({"rules": [rule(commands=["ls >"])]}, "commands[0]: `>` needs a path glob"),
        ({"rules": [rule(commands=[{"pattern": "rm", "when": "outside"}])]}, "commands[0]: when: must be one of"),
        ({"rules": [rule(commands=[{"pattern": "rm", "if": "x"}])]}, "commands[0]: unknown field 'if'"),
        ({"rules": [rule(commands=[{"when": "outside-repos"}])]}, "commands[0]: a pattern must be a non-empty"),
        ({"rules": [rule(tools=["file_read"], commands=["ls"])]}, "rules[0] ('r'): commands: apply only to"),
        ({"rules": [rule(tools=["terminal_exec"], paths=["~/**"])]}, "rules[0] ('r'): paths: apply only to"),
        ({"rules": [rule(paths="~/**")]}, "rules[0] ('r'): paths: must be a non-empty list"),
        ({"rules": [rule(description=3)]}, "rules[0] ('r'): description: must be a string"),
        ({"rules": [rule(), rule(id="s", decision=None)]}, "rules[1] ('s'): decision:"),
    ],
)
def test_validation_errors_name_the_rule_and_the_field(data: object, expected: str) -> None:
    assert expected in error_of(data)


def test_a_policy_error_is_a_value_error() -> None:
    assert issubclass(PolicyError, ValueError)


def test_the_known_scopes_are_the_oauth_scopes() -> None:
    from oauth.models import SCOPE_ALL, SCOPE_READ

    assert set(SCOPES) == {SCOPE_ALL, SCOPE_READ}


def test_the_known_tools_are_the_registered_tools() -> None:
    import mcpserver.tools  # noqa: F401 - registers the tools
    from mcpserver.registry import TOOLS

    assert set(TOOL_NAMES) == set(TOOLS)


# Which calls a rule is about


def test_a_rule_with_commands_is_about_the_command_tools_only() -> None:
    parsed = Rule.from_dict(rule(commands=["sudo"]))
    assert [tool for tool in TOOL_NAMES if parsed.covers(tool)] == ["terminal_exec", "terminal_exec_background"]


def test_a_rule_with_paths_is_about_the_tools_with_path_arguments() -> None:
    parsed = Rule.from_dict(rule(paths=["~/**"]))
    assert parsed.covers("file_write") and parsed.covers("git_commit")
    assert not parsed.covers("terminal_exec") and not parsed.covers("workspace_info")


def test_a_rule_without_patterns_is_about_every_tool_unless_it_names_some() -> None:
    assert all(Rule.from_dict(rule()).covers(tool) for tool in TOOL_NAMES)
    assert [tool for tool in TOOL_NAMES if Rule.from_dict(rule(tools=["file_*"])).covers(tool)] == [
        name for name in TOOL_NAMES if name.startswith("file_")
    ]


@pytest.mark.parametrize(
    ("who", "user", "credential", "client", "scopes", "matches"),
    [
        (Who(), "alice", "t", None, {"mcp"}, True),
        (Who(users=("bob",)), "alice", "t", None, {"mcp"}, False),
        (Who(users=("bob", "alice")), "alice", "t", None, {"mcp"}, True),
        (Who(credentials=("ci",)), "alice", "laptop", None, {"mcp"}, False),
        (Who(credentials=("ci",)), "alice", "ci", None, {"mcp"}, True),
        (Who(clients=("claude",)), "alice", "t", None, {"mcp"}, False),
        (Who(clients=("claude",)), "alice", "t", "claude", {"mcp"}, True),
        (Who(scopes=("mcp:read",)), "alice", "t", None, {"mcp"}, False),
        (Who(scopes=("mcp:read",)), "alice", "t", None, {"mcp:read"}, True),
        (Who(users=("alice",), scopes=("mcp:read",)), "alice", "t", None, {"mcp"}, False),
    ],
)
def test_every_who_field_given_must_match(
    who: Who, user: str, credential: str, client: str | None, scopes: set[str], matches: bool
) -> None:
    assert who.matches(user, credential, client, scopes) is matches


# Globs


@pytest.mark.parametrize(
    ("glob", "path", "matches"),
    [
        ("*.py", "app.py", True),
        ("*.py", "src/app.py", False),
        ("**/*.py", "app.py", True),
        ("**/*.py", "src/deep/app.py", True),
        ("src/**", "src", True),
        ("src/**", "src/a/b", True),
        ("src/**", "srcx", False),
        (".*", ".bashrc", True),
        (".*/**", ".ssh/authorized_keys", True),
        ("?", "a", True),
        ("?", "/", False),
        ("[ab]x", "bx", True),
        ("[!ab]x", "cx", True),
        ("[!ab]x", "/x", False),
        ("[ab", "[ab", True),
        ("a+b(c)", "a+b(c)", True),
    ],
)
def test_a_star_stays_in_a_segment_and_two_stars_cross_them(glob: str, path: str, matches: bool) -> None:
    assert (glob_regex(glob).fullmatch(path) is not None) is matches


@pytest.mark.parametrize(
    ("glob", "path", "matches"),
    [
        ("~/.*", "/home/agent/.bashrc", True),
        ("~/.*", "/home/agent/ws/.env", False),
        ("~/.*/**", "/home/agent/.ssh/authorized_keys", True),
        ("src/*.py", "/home/agent/ws/src/app.py", True),
        ("src/*.py", "/elsewhere/src/app.py", False),
        ("/etc/**", "/etc/passwd", True),
        ("/dev/sd*", "/dev/sda1", True),
    ],
)
def test_path_globs_are_anchored_at_the_home_the_root_or_the_workspace(glob: str, path: str, matches: bool) -> None:
    places = Places(workspace="/home/agent/ws", home="/home/agent")
    assert PathGlob(glob).matches(path, places) is matches


def test_a_pattern_with_a_condition_keeps_it() -> None:
    pattern = CommandPattern("rm -r", "outside-repos")
    assert (pattern.text, pattern.when) == ("rm -r", "outside-repos")
    with pytest.raises(PatternError):
        CommandPattern("rm -r", "sometimes")


# The pattern language


def matches(pattern: str, command: str, when: str | None = None, cwd: str = "/srv/ws/app") -> bool:
    """Whether `pattern` matches any simple command of `command`, run in `cwd`."""
    parsed = parse_command(command)
    scene = Scene(parsed, Places("/srv/ws", "/home/agent", ("/srv/ws/app",), cwd))
    compiled = CommandPattern(pattern, when)
    return any(compiled.matches(scene, index) for index in range(len(parsed.commands)))


@pytest.mark.parametrize(
    ("pattern", "command", "expected"),
    [
        ("rm -r", "rm -fr x", True),
        ("rm -r", "rm -Rr x", True),
        ("rm -r", "rm -f x", False),
        ("rm -r", "rm -- -r", False),
        ("rm -r", "rm $FLAGS x", False),
        ("rm -rf", "rm -r -f x", True),
        ("rm -rf", "rm -r x", False),
        ("rm -r|-R|--recursive", "rm --recursive x", True),
        ("rm -r", "/usr/bin/rm -r x", True),
        ("git push --force", "git push --force=yes", True),
        ("git push --force", "git push --forc", True),
        ("git push --force", "git push --follow-tags", False),
        ("git push", "git -C repo push origin", True),
        ("git push", "git pull origin", False),
        ("git push +**", "git push origin +refs/heads/a:refs/heads/b", True),
        ("mkfs.*", "mkfs.ext4 /dev/sda1", True),
        ("mkfs.*", "mkfs /dev/sda1", False),
        ("dd of=*.img", "dd if=/dev/zero of=a.img", True),
        ("dd of=/dev/sd*", "dd if=x of=../../../dev/sda", True),
        (">logs/*.txt", "echo x > logs/a.txt", False),  # from the repository app, not the workspace
        (">app/logs/*.txt", "echo x > logs/a.txt", True),
        (">app/logs/*.txt", "cd logs && echo x > a.txt", True),
        (">~/.*", "echo x >> $HOME/.profile", True),
        (">~/.*", "echo x > $OUT/.profile", False),
        ("tee ~/.*", "tee -a /home/agent/.bashrc", True),
        ("curl | tee | sh", "curl x | tee f | sh", True),
        ("curl | tee | sh", "curl x | sh | tee f", False),
        ("curl | sh", "sh | curl x", False),
        ("curl | sh", "curl x; sh", False),
    ],
)
def test_the_pattern_language(pattern: str, command: str, expected: bool) -> None:
    assert matches(pattern, command) is expected


@pytest.mark.parametrize(
    ("command", "cwd", "outside_repos", "outside_workspace"),
    [
        ("rm -r build", "/srv/ws/app", False, False),
        ("rm -r build", "/srv/ws", True, False),
        ("rm -r /srv/ws/app", "/srv/ws", True, False),
        ("rm -r /etc/x", "/srv/ws/app", True, True),
        ("rm -r $X", "/srv/ws/app", True, True),
        ("find . | xargs rm -r", "/srv/ws/app", True, True),
        ("rm -r", "/srv/ws/app", False, False),
    ],
)
def test_conditions_look_at_where_the_operands_lead(
    command: str, cwd: str, outside_repos: bool, outside_workspace: bool
) -> None:
    assert matches("rm -r", command, "outside-repos", cwd) is outside_repos
    assert matches("rm -r", command, "outside-workspace", cwd) is outside_workspace
