"""Policy rules as data: who a rule is for, which calls it is about, and what it decides.

A policy is JSON-compatible:

    {"default": "allow",            # for what no rule matches (today's behaviour)
     "opaque": "ask",               # optional; for commands the parser cannot see through (see evaluate.py)
     "rules": [
        {"id": "force-push",        # the name the audit log shows
         "decision": "ask",         # allow | ask | deny
         "who": {"users": ["alice"], "credentials": ["ci"], "clients": ["…"], "scopes": ["mcp:read"]},
         "tools": ["terminal_*"],   # globs over tool names; default: every tool the rule's patterns are about
         "commands": ["git push -f|--force", {"pattern": "rm -r", "when": "outside-repos"}],
         "paths": ["~/.*", "~/.*/**"],
         "approver": "staff",       # ask rules: "staff", or "user" (the client's own user may approve too)
         "description": "why, for the admin reading it later"}]}

`who` keys are each a list, any entry matching; every key given must match (a rule for user alice with scope
`mcp:read` is about alice's read-only credentials only); no `who` is anyone. A scope matches a caller holding it.
`commands` are patterns (patterns.py documents the language) over what the command tools (COMMAND_TOOLS) run;
`paths` are path globs (paths.py) over the paths the file and git tools name (PATH_ARGUMENTS). A rule with
neither is about whole calls of its tools; with `commands` or `paths` it is about the commands or paths they match,
so `tools` must then include a tool they apply to. Errors (`PolicyError`) name the rule's index, its id and the
field; unknown keys are refused, so a misspelt field cannot silently widen a rule.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, cast

from mcpserver.policy.paths import GlobError, PathGlob, glob_regex
from mcpserver.policy.patterns import CONDITIONS, CommandPattern, PatternError

Decision = Literal["allow", "ask", "deny"]
Approver = Literal["staff", "user"]
APPROVERS: tuple[Approver, ...] = ("staff", "user")
DECISIONS: tuple[Decision, ...] = ("allow", "ask", "deny")  # from the least strict to the most
RESERVED_IDS = frozenset({"default", "opaque"})  # what a verdict names when no rule decided
SCOPES = ("mcp", "mcp:read")  # oauth.models.SCOPE_ALL and SCOPE_READ (a test keeps them equal)
# The wire contract's tools (a test keeps this equal to the registry), so that a misspelt name is refused.
TOOL_NAMES = (
    "file_read",
    "file_write",
    "file_delete",
    "file_list",
    "file_move",
    "file_mkdir",
    "file_edit",
    "file_multi_edit",
    "apply_patch",
    "file_grep",
    "file_glob",
    "git_clone",
    "git_status",
    "git_commit",
    "git_push",
    "git_pull",
    "git_branch",
    "git_checkout",
    "git_diff",
    "git_log",
    "terminal_exec",
    "terminal_exec_background",
    "terminal_kill",
    "terminal_output",
    "terminal_list",
    "terminal_input",
    "workspace_info",
    "workspace_install",
)
COMMAND_TOOLS = frozenset({"terminal_exec", "terminal_exec_background"})  # arguments `command` and `cwd`
# The arguments naming paths (absolute, or relative to the workspace): files, and the repository a git tool uses.
PATH_ARGUMENTS: Mapping[str, tuple[str, ...]] = {
    "file_read": ("path",),
    "file_write": ("path",),
    "file_delete": ("path",),
    "file_list": ("path",),
    "file_move": ("source", "dest"),
    "file_mkdir": ("path",),
    "file_edit": ("path",),
    "file_multi_edit": ("path",),
    "apply_patch": ("input",),  # its patch: every path the patch names (evaluate.py reads them as the executor does)
    "file_grep": ("path",),
    "file_glob": ("path",),
    **{name: ("path",) for name in TOOL_NAMES if name.startswith("git_")},
}
_MAX_FOUND = 4096
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}")


class PolicyError(ValueError):
    """A policy or rule that cannot be used; the message names where and why."""


@dataclass(frozen=True)
class Who:
    """Whom a rule is about: each field given must match; an empty field is anyone."""

    users: tuple[str, ...] = ()
    credentials: tuple[str, ...] = ()  # credential names (labels of tokens and OAuth applications)
    clients: tuple[str, ...] = ()  # OAuth client ids of connected apps
    scopes: tuple[str, ...] = ()
    anyone: bool = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "anyone", not (self.users or self.credentials or self.clients or self.scopes))

    def matches(self, user: str, credential: str, client_id: str | None, scopes: Collection[str]) -> bool:
        return (
            (not self.users or user in self.users)
            and (not self.credentials or credential in self.credentials)
            and (not self.clients or client_id in self.clients)
            and (not self.scopes or any(scope in scopes for scope in self.scopes))
        )

    @classmethod
    def from_dict(cls, data: object, where: str) -> Who:
        mapping = _mapping(data, where)
        _no_unknown_keys(mapping, ("users", "credentials", "clients", "scopes"), where)
        values = {key: _strings(value, f"{where}.{key}") for key, value in mapping.items()}
        for scope in values.get("scopes", ()):
            if scope not in SCOPES:
                raise PolicyError(f"{where}.scopes: unknown scope {scope!r} (known: {', '.join(SCOPES)})")
        return cls(**values)

    def to_dict(self) -> dict[str, list[str]]:
        fields = {"users": self.users, "credentials": self.credentials, "clients": self.clients, "scopes": self.scopes}
        return {key: list(value) for key, value in fields.items() if value}


@dataclass(frozen=True)
class Rule:
    id: str
    decision: Decision
    who: Who = Who()
    tools: tuple[str, ...] = ()  # globs; empty: the tools its patterns are about, or every tool
    commands: tuple[CommandPattern, ...] = ()
    paths: tuple[PathGlob, ...] = ()
    description: str = ""
    approver: Approver = "staff"  # who may answer an ask: staff only, or also the client's own user (elicitation)
    # Whether it is about the commands or paths of a call rather than about whole calls.
    about_parts: bool = field(init=False, compare=False, repr=False)
    _tools: re.Pattern[str] = field(init=False, compare=False, repr=False)
    _names: re.Pattern[str] = field(init=False, compare=False, repr=False)  # of the commands its patterns match

    def __post_init__(self) -> None:
        object.__setattr__(self, "about_parts", bool(self.commands or self.paths))
        globs = self.tools or self._implied_tools()
        object.__setattr__(self, "_tools", _either(glob_regex(glob) for glob in globs))
        object.__setattr__(self, "_names", _either(pattern.stages[-1].name for pattern in self.commands))

    def _implied_tools(self) -> tuple[str, ...]:
        if not self.commands and not self.paths:
            return ("*",)
        tools: list[str] = []
        if self.commands:
            tools += sorted(COMMAND_TOOLS)
        if self.paths:
            tools += PATH_ARGUMENTS
        return tuple(tools)

    def may_match(self, name: str) -> bool:
        """Whether a command of this name may match one of its patterns (a quick test before the patterns')."""
        return self._names.fullmatch(name) is not None

    def covers(self, tool: str) -> bool:
        """Whether the rule is about calls of `tool`."""
        return self._tools.fullmatch(tool) is not None

    @classmethod
    def from_dict(cls, data: object, index: int = 0) -> Rule:
        where = f"rules[{index}]"
        mapping = _mapping(data, where)
        if isinstance(mapping.get("id"), str):
            where += f" ({mapping['id']!r})"
        _no_unknown_keys(
            mapping, ("id", "decision", "who", "tools", "commands", "paths", "description", "approver"), where
        )
        rule_id = mapping.get("id")
        if not isinstance(rule_id, str) or not _ID.fullmatch(rule_id):
            raise PolicyError(f"{where}: id: needs 1 to 64 letters, digits or `_.:-`, starting with a letter or digit")
        if rule_id in RESERVED_IDS:
            raise PolicyError(f"{where}: id: {rule_id!r} is what verdicts name when no rule decided; choose another")
        description = mapping.get("description", "")
        if not isinstance(description, str):
            raise PolicyError(f"{where}: description: must be a string")
        approver = mapping.get("approver", "staff")
        if approver not in APPROVERS:
            raise PolicyError(f"{where}: approver: must be one of {', '.join(APPROVERS)}, not {approver!r}")
        if approver != "staff" and mapping.get("decision") != "ask":
            raise PolicyError(f"{where}: approver: only an ask rule has approvers")
        rule = cls(
            id=rule_id,
            decision=_decision(mapping.get("decision"), f"{where}: decision"),
            who=Who.from_dict(mapping["who"], f"{where}: who") if "who" in mapping else Who(),
            tools=_tool_globs(mapping["tools"], f"{where}: tools") if "tools" in mapping else (),
            commands=_patterns(mapping["commands"], f"{where}: commands") if "commands" in mapping else (),
            paths=_path_globs(mapping["paths"], f"{where}: paths") if "paths" in mapping else (),
            description=description,
            approver=approver,
        )
        _check_applies(rule, where)
        return rule

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"id": self.id, "decision": self.decision}
        if self.who != Who():
            data["who"] = self.who.to_dict()
        if self.tools:
            data["tools"] = list(self.tools)
        if self.commands:
            data["commands"] = [
                pattern.text if pattern.when is None else {"pattern": pattern.text, "when": pattern.when}
                for pattern in self.commands
            ]
        if self.paths:
            data["paths"] = [glob.text for glob in self.paths]
        if self.description:
            data["description"] = self.description
        if self.approver != "staff":
            data["approver"] = self.approver
        return data


@dataclass(frozen=True)
class Policy:
    rules: tuple[Rule, ...] = ()
    default: Decision = "allow"
    opaque: Decision | None = None  # None: `ask` if any rule asks, else the default
    # Rules by tool, and by tool and command name, as evaluations find them (a policy is evaluated many times).
    _found: dict[tuple[str, str | None], tuple[Rule, ...]] = field(
        default_factory=dict, init=False, compare=False, repr=False
    )

    def rules_for(self, tool: str, name: str | None = None) -> tuple[Rule, ...]:
        """The rules about calls of `tool`, in order; with a command's `name`, only those that may be about it."""
        found = self._found.get((tool, name))
        if found is None:
            if len(self._found) >= _MAX_FOUND:  # command names are the agent's to choose: keep the memory bounded
                self._found.clear()
            found = tuple(
                rule
                for rule in self.rules
                if rule.covers(tool) and (name is None or not rule.about_parts or rule.may_match(name))
            )
            self._found[tool, name] = found
        return found

    @property
    def opaque_decision(self) -> Decision:
        if self.opaque is not None:
            return self.opaque
        return "ask" if any(rule.decision == "ask" for rule in self.rules) else self.default

    @classmethod
    def from_dict(cls, data: object) -> Policy:
        mapping = _mapping(data, "policy")
        _no_unknown_keys(mapping, ("rules", "default", "opaque"), "policy")
        rules_data = mapping.get("rules", [])
        if not isinstance(rules_data, list):
            raise PolicyError("policy: rules: must be a list of rules")
        rules = tuple(Rule.from_dict(rule, index) for index, rule in enumerate(rules_data))
        seen: dict[str, int] = {}
        for index, rule in enumerate(rules):
            if rule.id in seen:
                raise PolicyError(f"rules[{index}] ({rule.id!r}): id: already used by rules[{seen[rule.id]}]")
            seen[rule.id] = index
        opaque = mapping.get("opaque")
        return cls(
            rules=rules,
            default=_decision(mapping.get("default", "allow"), "policy: default"),
            opaque=None if opaque is None else _decision(opaque, "policy: opaque"),
        )

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"default": self.default}
        if self.opaque is not None:
            data["opaque"] = self.opaque
        data["rules"] = [rule.to_dict() for rule in self.rules]
        return data


def _either(patterns: Iterable[re.Pattern[str]]) -> re.Pattern[str]:
    """One expression matching what any of `patterns` matches (none: nothing)."""
    return re.compile("|".join(f"(?:{pattern.pattern})" for pattern in patterns) or "(?!)", re.DOTALL)


def _mapping(data: object, where: str) -> Mapping[str, object]:
    if not isinstance(data, Mapping) or not all(isinstance(key, str) for key in data):
        raise PolicyError(f"{where}: must be an object")
    return cast(Mapping[str, object], data)


def _no_unknown_keys(mapping: Mapping[str, object], known: tuple[str, ...], where: str) -> None:
    unknown = [key for key in mapping if key not in known]
    if unknown:
        raise PolicyError(f"{where}: unknown field {unknown[0]!r} (known: {', '.join(known)})")


def _decision(value: object, where: str) -> Decision:
    if value not in DECISIONS:
        raise PolicyError(f"{where}: must be one of {', '.join(DECISIONS)}, not {value!r}")
    return value


def _strings(value: object, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not value:
        raise PolicyError(f"{where}: must be a non-empty list (leave the field out to mean any)")
    for at, item in enumerate(value):
        if not isinstance(item, str) or not item:
            raise PolicyError(f"{where}[{at}]: must be a non-empty string")
    return tuple(value)


def _tool_globs(value: object, where: str) -> tuple[str, ...]:
    globs = _strings(value, where)
    for at, glob in enumerate(globs):
        try:
            names_a_tool = any(glob_regex(glob).fullmatch(name) for name in TOOL_NAMES)
        except GlobError as error:
            raise PolicyError(f"{where}[{at}]: {error}") from error
        if not names_a_tool:
            raise PolicyError(f"{where}[{at}]: {glob!r} names no tool")
    return globs


def _patterns(value: object, where: str) -> tuple[CommandPattern, ...]:
    if not isinstance(value, list) or not value:
        raise PolicyError(f"{where}: must be a non-empty list of patterns")
    patterns = []
    for at, item in enumerate(value):
        here = f"{where}[{at}]"
        if isinstance(item, Mapping):
            mapping = _mapping(item, here)
            _no_unknown_keys(mapping, ("pattern", "when"), here)
            text, when = mapping.get("pattern"), mapping.get("when")
            if when is not None and when not in CONDITIONS:
                raise PolicyError(f"{here}: when: must be one of {', '.join(CONDITIONS)}, not {when!r}")
        else:
            text, when = item, None
        if not isinstance(text, str) or not text.strip():
            raise PolicyError(f"{here}: a pattern must be a non-empty string")
        try:
            patterns.append(CommandPattern(text, when))
        except (PatternError, GlobError) as error:
            raise PolicyError(f"{here}: {error}") from error
    return tuple(patterns)


def _path_globs(value: object, where: str) -> tuple[PathGlob, ...]:
    globs = []
    for at, glob in enumerate(_strings(value, where)):
        try:
            globs.append(PathGlob(glob))
        except GlobError as error:
            raise PolicyError(f"{where}[{at}]: {error}") from error
    return tuple(globs)


def _check_applies(rule: Rule, where: str) -> None:
    """Refuse patterns that could never match because the rule's tools have no commands or paths."""
    if rule.commands and not any(rule.covers(tool) for tool in COMMAND_TOOLS):
        raise PolicyError(f"{where}: commands: apply only to {', '.join(sorted(COMMAND_TOOLS))}, not in its tools")
    if rule.paths and not any(rule.covers(tool) for tool in PATH_ARGUMENTS):
        raise PolicyError(f"{where}: paths: apply only to tools with path arguments, none in its tools")
