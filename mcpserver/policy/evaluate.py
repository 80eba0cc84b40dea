"""Deciding one tool call: `evaluate(policy, facts)` gives a `Verdict` (decision, the rule that decided, why).

A call is decided part by part:
- a command tool's call (`terminal_exec`, `terminal_exec_background`): each simple command its `command` would run
  (shell.py), and, when the parse is opaque, the part that cannot be seen;
- a file or git tool's call: each path it names (PATH_ARGUMENTS; a missing or empty path is the workspace);
- any other call, or a command that runs nothing visible: the call itself.

A visible part is decided by the first rule, in the policy's order, that is about it: the rule's `who` matches the
caller, its `tools` the tool, and one of its patterns or path globs the part (a rule without patterns or globs is
about every part of its tools' calls). A part no rule is about gets the policy's default, except a wrapper that only
runs another command (`env`, `nohup`, `timeout`, `xargs`, `bash -c`, …: `SimpleCommand.wrapper`), which counts only
when a rule names it, the command it runs being a part of its own (so an allow-list policy need not list `nohup`).
`sudo`, `doas`, `su`, `pkexec` and `chroot` are not such wrappers: they get the default too. The part an opaque
command hides gets the policy's `opaque` decision.

The verdict is the strictest decision of the parts (deny, then ask, then allow). Between parts as strict, a rule's
verdict is preferred to the opaque part's and that to the default's (the audit log then names the most telling
reason), then the earlier part. So:
- a deny rule matching any visible part of a command denies it, opaque or not;
- an allow rule cannot approve a command chained to the one it matches (`ls; sudo rm x` asks about sudo), nor
  what an opaque command hides: with `opaque` at `ask`, `eval "$X"` asks even where a rule allows `eval`.

`evaluate` touches nothing outside its arguments: the caller supplies the git repositories it knows of. Parses
are cached by command text (shell.py), so a command evaluated again costs only the matching.
"""

from __future__ import annotations

import functools
import shlex
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass

from mcpserver.policy.commands import ParsedCommand, SimpleCommand
from mcpserver.policy.paths import Places, normalise
from mcpserver.policy.rules import COMMAND_TOOLS, DECISIONS, PATH_ARGUMENTS, Decision, Policy, Rule
from mcpserver.policy.scene import Scene, start_directory
from mcpserver.policy.shell import parse_command

DEFAULT_ID = "default"
OPAQUE_ID = "opaque"
_SHOWN_CHARS = 200  # of a command, in a reason


@dataclass(frozen=True)
class Caller:
    """Who makes the call (from the request's principal)."""

    user: str
    credential: str  # the credential's name: a token's label or an OAuth application's name
    client_id: str | None = None  # the OAuth client id of a connected app
    scopes: frozenset[str] = frozenset()


@dataclass(frozen=True)
class CallFacts:
    """Everything a verdict depends on. Paths are absolute and normalised."""

    tool: str
    arguments: Mapping[str, object]
    caller: Caller
    workspace: str
    home: str
    git_roots: Collection[str] = ()  # repositories under the workspace, as the caller knows them


@dataclass(frozen=True)
class Verdict:
    decision: Decision
    rule_id: str  # the rule that decided, or DEFAULT_ID / OPAQUE_ID
    reason: str


@dataclass(frozen=True)
class _Part:
    """One part's decision; its reason is written only for the part that becomes the verdict."""

    decision: Decision
    rule_id: str
    describe: Callable[[], str]

    @property
    def weight(self) -> tuple[int, int]:
        # Stricter first; then a rule's verdict, the opaque part's, the default's.
        return DECISIONS.index(self.decision), _RANK.get(self.rule_id, 2)


_RANK = {DEFAULT_ID: 0, OPAQUE_ID: 1}


def evaluate(policy: Policy, facts: CallFacts) -> Verdict:
    """The policy's verdict on the call that `facts` describe."""
    if facts.tool in COMMAND_TOOLS:
        parts = _command_parts(policy, facts)
    elif facts.tool in PATH_ARGUMENTS:
        parts = _path_parts(policy, facts)
    else:
        parts = iter([_whole_call(policy, facts)])
    best: _Part | None = None
    for part in parts:
        if best is None or part.weight > best.weight:
            best = part
            if part.decision == "deny" and part.rule_id not in _RANK:
                break  # nothing outweighs it
    assert best is not None  # every call has a part
    return Verdict(best.decision, best.rule_id, best.describe())


def _callers(rules: Iterable[Rule], caller: Caller) -> Iterator[Rule]:
    """The rules whose `who` matches the caller, in order."""
    for rule in rules:
        if rule.who.anyone or rule.who.matches(caller.user, caller.credential, caller.client_id, caller.scopes):
            yield rule


def _places(facts: CallFacts, cwd: object = None) -> Places:
    workspace, home = normalise(facts.workspace), normalise(facts.home)
    return Places(workspace, home, facts.git_roots, start_directory(cwd, workspace, home))


def _command_parts(policy: Policy, facts: CallFacts) -> Iterator[_Part]:
    command = facts.arguments.get("command")
    parsed = parse_command(command) if isinstance(command, str) else ParsedCommand((), ("the command is not a string",))
    scene = Scene(parsed, _places(facts, facts.arguments.get("cwd")))
    decided = False
    for index, simple in enumerate(parsed.commands):
        if not simple.argv and not any(redirect.writes for redirect in simple.redirects):
            continue  # only assignments: nothing runs
        candidates = _callers(policy.rules_for(facts.tool, simple.name), facts.caller)
        rule = next((rule for rule in candidates if _about_command(rule, scene, index)), None)
        if rule is not None:
            decided = True
            yield _Part(rule.decision, rule.id, functools.partial(_matched, rule, simple))
        elif not simple.wrapper:
            decided = True
            yield _Part(policy.default, DEFAULT_ID, functools.partial(_unmatched, simple))
    if not decided:
        yield _whole_call(policy, facts)
    if parsed.opaque:
        yield _Part(policy.opaque_decision, OPAQUE_ID, functools.partial(_opaque, parsed))


def _about_command(rule: Rule, scene: Scene, index: int) -> bool:
    return not rule.about_parts or any(pattern.matches(scene, index) for pattern in rule.commands)


def _path_parts(policy: Policy, facts: CallFacts) -> Iterator[_Part]:
    places = _places(facts)
    for name in PATH_ARGUMENTS[facts.tool]:
        value = facts.arguments.get(name)
        if not value:  # a missing or empty path is the workspace (file_list, the git tools' repository)
            path: str | None = places.workspace
        else:
            path = places.resolve(value) if isinstance(value, str) else None
        shown = f"{name} {path or value!r}"
        candidates = _callers(policy.rules_for(facts.tool), facts.caller)
        rule = next((rule for rule in candidates if _about_path(rule, path, places)), None)
        if rule is not None:
            yield _Part(rule.decision, rule.id, functools.partial(str, f"rule {rule.id!r} matched {shown}"))
        else:
            yield _Part(policy.default, DEFAULT_ID, functools.partial(str, f"no rule matched {shown}"))


def _about_path(rule: Rule, path: str | None, places: Places) -> bool:
    if not rule.about_parts:
        return True
    return path is not None and any(glob.matches(path, places) for glob in rule.paths)


def _whole_call(policy: Policy, facts: CallFacts) -> _Part:
    candidates = _callers(policy.rules_for(facts.tool), facts.caller)
    rule = next((rule for rule in candidates if not rule.about_parts), None)
    if rule is not None:
        return _Part(rule.decision, rule.id, functools.partial(str, f"rule {rule.id!r} is about {facts.tool} calls"))
    return _Part(policy.default, DEFAULT_ID, functools.partial(str, f"no rule is about this {facts.tool} call"))


def _matched(rule: Rule, command: SimpleCommand) -> str:
    return f"rule {rule.id!r} matched `{_shown(command)}`"


def _unmatched(command: SimpleCommand) -> str:
    return f"no rule matched `{_shown(command)}`"


def _opaque(parsed: ParsedCommand) -> str:
    return "the command is opaque: " + "; ".join(parsed.opaque_reasons)


def _shown(command: SimpleCommand) -> str:
    words = [_quoted(word) for word in command.assignments + command.argv]
    words += [f"{redirect.operator} {_quoted(redirect.target)}" for redirect in command.redirects if redirect.writes]
    text = " ".join(words)
    return text if len(text) <= _SHOWN_CHARS else text[: _SHOWN_CHARS - 1] + "…"


def _quoted(word: str) -> str:
    """`word` as a shell would need it written; a leading `~/` stays bare, as the shell expands it."""
    if word.startswith("~/") and shlex.quote(word[2:]) == word[2:]:
        return word
    return shlex.quote(word)
