"""Deciding one tool call: `evaluate(policy, facts)` gives a `Verdict` (decision, the rule that decided, why).

A call is decided part by part:
- a command tool's call (`terminal_exec`, `terminal_exec_background`): each simple command its `command` would run
  (shell.py), and, when the parse is opaque, the part that cannot be seen. Started with `stdin` or `pty`, a
  command that runs what is typed into it later (`bash`, `python3`, `psql`) is opaque;
- a `terminal_input` call: the call itself, and, when its job runs what is typed into it (`Job`), the typed text
  decided as a command of `terminal_exec_background` (TYPED_AS), before it reaches the job (`_typed_parts`);
- a file or git tool's call: each path it names (PATH_ARGUMENTS; a missing or empty path is the workspace);
- an `apply_patch` call: each path its patch adds, deletes, updates or moves a file to, read by the executor's own
  parser (a patch it cannot read changes nothing, the executor refusing it alike: only its whole call is decided);
- any other call, or a command that runs nothing visible: the call itself.
A word or path whose `~name` names no user here (paths.unknown_tilde) adds an opaque part.

A visible part is decided by the first rule, in the policy's order, that is about it: the rule's `who` matches the
caller, its `tools` the tool, and one of its patterns or path globs the part (a rule without patterns or globs is
about every part of its tools' calls). A part no rule is about gets the policy's default, except a wrapper that only
runs another command (`env`, `nohup`, `timeout`, `xargs`, `bash -c`, …: `SimpleCommand.wrapper`), which counts only
when a rule names it, the command it runs being a part of its own (so an allow-list policy need not list `nohup`).
`sudo`, `doas`, `su`, `pkexec` and `chroot` are not such wrappers: they get the default too. The part an opaque
command hides gets the policy's `opaque` decision.

The verdict is the strictest decision of the parts (deny, then ask, then allow). Between asks, one only staff may
answer outweighs one the client's own user may answer (`"approver": "user"`), so that the call's approver is the
strictest of its parts: `uname -m; sudo id` needs staff when the rule about `sudo` does, whatever the rule about
`uname` says (the opaque part and the default always need staff). Likewise within a part: when the rule deciding it
asks the client's user, a later ask rule about the same part that needs staff decides it instead (`uname >
~/.bashrc` needs staff when the dot-file rule does). Between parts as strict, a rule's verdict is
preferred to the opaque part's and that to the default's (the audit log then names the most telling reason), then
the earlier part. So:
- a deny rule matching any visible part of a command denies it, opaque or not;
- an allow rule cannot approve a command chained to the one it matches (`ls; sudo rm x` asks about sudo), nor
  what an opaque command hides: with `opaque` at `ask`, `eval "$X"` asks even where a rule allows `eval`.

`evaluate` touches nothing outside its arguments: the caller supplies the git repositories it knows of. Parses
are cached by command text (shell.py), so a command evaluated again costs only the matching.
"""

from __future__ import annotations

import functools
import itertools
import shlex
import unicodedata
from collections.abc import Callable, Collection, Generator, Iterable, Iterator, Mapping
from dataclasses import dataclass

from mcpserver.executor.patch import PatchError, patch_paths
from mcpserver.policy.commands import InputReader, ParsedCommand, SimpleCommand
from mcpserver.policy.paths import Places, normalise, unknown_tilde
from mcpserver.policy.rules import COMMAND_TOOLS, DECISIONS, PATH_ARGUMENTS, Approver, Decision, Policy, Rule
from mcpserver.policy.scene import Scene, start_directory
from mcpserver.policy.shell import parse_command

DEFAULT_ID = "default"
OPAQUE_ID = "opaque"
TYPING_TOOL = "terminal_input"
PATCH_TOOL = "apply_patch"
TYPED_AS = "terminal_exec_background"  # the tool whose rules decide what is typed into a job: it started the job
_SHOWN_CHARS = 200  # of a command, in a reason
# Keys typed alone that run nothing: Ctrl-C, Ctrl-D, Ctrl-Z, Ctrl-\ (signals and end of input).
_KEYS = frozenset("\x03\x04\x1a\x1c")
_UNKNOWN_JOB = (InputReader("the background command", shell=True),)


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
    job: Job | None = None  # terminal_input's job; None: not known, typed text is then read as shell text


@dataclass(frozen=True)
class Job:
    """The background command terminal_input types into, as the server recorded it."""

    command: str | None  # None: not known (not found, or not started yet)
    cwd: str = ""


@dataclass(frozen=True)
class Verdict:
    decision: Decision
    rule_id: str  # the rule that decided, or DEFAULT_ID / OPAQUE_ID
    reason: str
    approver: Approver = "staff"  # of an ask: "user" only when every part that asks lets the client's user answer


@dataclass(frozen=True)
class _Part:
    """One part's decision; its reason is written only for the part that becomes the verdict."""

    decision: Decision
    rule_id: str
    describe: Callable[[], str]
    approver: Approver = "staff"

    @property
    def weight(self) -> tuple[int, int, int]:
        # Stricter first; between asks, one that needs staff; then a rule's verdict, the opaque part's, the default's.
        needs_staff = self.decision == "ask" and self.approver == "staff"
        return DECISIONS.index(self.decision), needs_staff, _RANK.get(self.rule_id, 2)


_RANK = {DEFAULT_ID: 0, OPAQUE_ID: 1}


def evaluate(policy: Policy, facts: CallFacts) -> Verdict:
    """The policy's verdict on the call that `facts` describe."""
    if facts.tool in COMMAND_TOOLS:
        parts = _command_parts(policy, facts)
    elif facts.tool == TYPING_TOOL:
        parts = itertools.chain(_typed_parts(policy, facts), [_whole_call(policy, facts)])
    elif facts.tool == PATCH_TOOL:
        parts = _patch_parts(policy, facts)
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
    return Verdict(best.decision, best.rule_id, best.describe(), best.approver if best.decision == "ask" else "staff")


def _callers(rules: Iterable[Rule], caller: Caller) -> Iterator[Rule]:
    """The rules whose `who` matches the caller, in order."""
    for rule in rules:
        if rule.who.anyone or rule.who.matches(caller.user, caller.credential, caller.client_id, caller.scopes):
            yield rule


def _deciding(candidates: Iterator[Rule], about: Callable[[Rule], bool]) -> Rule | None:
    """The first rule about a part; but for an ask the client's user may answer, a later ask rule about the same
    part that needs staff, if there is one (a part's approver is the strictest of the rules asking about it)."""
    rule = next((rule for rule in candidates if about(rule)), None)
    if rule is None or rule.decision != "ask" or rule.approver == "staff":
        return rule
    return next((later for later in candidates if _needs_staff(later) and about(later)), rule)


def _needs_staff(rule: Rule) -> bool:
    return rule.decision == "ask" and rule.approver == "staff"


def _places(facts: CallFacts, cwd: object = None) -> Places:
    workspace, home = normalise(facts.workspace), normalise(facts.home)
    return Places(workspace, home, facts.git_roots, start_directory(cwd, workspace, home))


def _command_parts(policy: Policy, facts: CallFacts) -> Iterator[_Part]:
    command = facts.arguments.get("command")
    terminal = bool(facts.arguments.get("stdin") or facts.arguments.get("pty"))  # terminal_exec_background's
    if isinstance(command, str):
        parsed = parse_command(command, terminal)
    else:
        parsed = ParsedCommand((), ("the command is not a string",))
    scene = Scene(parsed, _places(facts, facts.arguments.get("cwd")))
    decided = yield from _simple_parts(policy, facts.caller, facts.tool, scene)
    if not decided:
        yield _whole_call(policy, facts)
    if parsed.opaque:
        yield _opaque_part(policy, _opaque(parsed))


def _simple_parts(policy: Policy, caller: Caller, tool: str, scene: Scene) -> Generator[_Part, None, bool]:
    """The parts of each simple command of the scene; returns whether any was decided by more than its wrapping."""
    decided = False
    for index, simple in enumerate(scene.commands):
        if not simple.argv and not any(redirect.writes for redirect in simple.redirects):
            continue  # only assignments: nothing runs
        candidates = _callers(policy.rules_for(tool, simple.name), caller)
        rule = _deciding(candidates, functools.partial(_about_command, scene=scene, index=index))
        if rule is not None:
            decided = True
            yield _Part(rule.decision, rule.id, functools.partial(_matched, rule, simple), rule.approver)
        elif not simple.wrapper:
            decided = True
            yield _Part(policy.default, DEFAULT_ID, functools.partial(_unmatched, simple))
        tilde = _unknown_tilde_of(simple)
        if tilde is not None:
            yield _opaque_part(policy, f"{tilde!r} names no user of this host, so the path it starts is not known")
    return decided


def _unknown_tilde_of(command: SimpleCommand) -> str | None:
    words = [*command.argv[1:], *(redirect.target for redirect in command.redirects if redirect.writes)]
    return next((found for word in words if (found := unknown_tilde(word)) is not None), None)


def _opaque_part(policy: Policy, reason: str) -> _Part:
    return _Part(policy.opaque_decision, OPAQUE_ID, functools.partial(str, reason))


def _typed_parts(policy: Policy, facts: CallFacts) -> Iterator[_Part]:
    """What typing `text` into the job runs, decided before it reaches the job. Nothing when the job does not run
    what is typed (`cat`, a script that asks a question). Else the text is decided as a command of TYPED_AS,
    in the directory the job started in but with its relative paths unknown (the shell may have moved since); and
    it is opaque when the policy cannot tell what the job will run from it: typed into another language (python,
    SQL), holding control characters a terminal's line editing acts on (Tab completes, Ctrl-Y pastes, ESC [A
    recalls the last line), or not ending its line, so that what runs depends on the text typed next."""
    job = facts.job or Job(None)
    readers = parse_command(job.command, True).readers if job.command is not None else _UNKNOWN_JOB
    text = facts.arguments.get("text")
    if not readers or (isinstance(text, str) and (not text or set(text) <= _KEYS)):
        return
    why = _unreadable(text, readers)
    if why is not None:
        yield _opaque_part(policy, why)
        return
    assert isinstance(text, str)  # _unreadable refuses any other
    parsed = parse_command(text, True)
    places = _places(facts, job.cwd)
    yield from _simple_parts(policy, facts.caller, TYPED_AS, Scene(parsed, places, cwd_known=False))
    if parsed.opaque:
        yield _opaque_part(policy, "the typed text is opaque: " + "; ".join(parsed.opaque_reasons))


def _unreadable(text: object, readers: tuple[InputReader, ...]) -> str | None:
    """Why what `text` makes the job run cannot be told from it, or None."""
    if not isinstance(text, str):
        return "the typed text is not a string"
    other = next((reader.name for reader in readers if not reader.shell), None)
    if other is not None:
        return f"the text is typed into `{other}`, whose language the policy does not read"
    controls = sorted({f"U+{ord(char):04X}" for char in text if char != "\n" and unicodedata.category(char) == "Cc"})
    if controls:
        return f"the typed text holds control characters ({', '.join(controls[:4])}) that line editing acts on"
    body = text.removesuffix("\n")
    if body == text or (len(body) - len(body.rstrip("\\"))) % 2:
        return "the typed text does not end its line, so what runs depends on the text typed next"
    return None


def _about_command(rule: Rule, *, scene: Scene, index: int) -> bool:
    return not rule.about_parts or any(pattern.matches(scene, index) for pattern in rule.commands)


def _path_parts(policy: Policy, facts: CallFacts) -> Iterator[_Part]:
    places = _places(facts)
    for name in PATH_ARGUMENTS[facts.tool]:
        yield from _path_part(policy, facts, places, name, facts.arguments.get(name))


def _patch_parts(policy: Policy, facts: CallFacts) -> Iterator[_Part]:
    patch = facts.arguments.get("input")
    try:
        paths = patch_paths(patch) if isinstance(patch, str) else []
    except PatchError:
        paths = []
    if not paths:  # not a patch the executor can read: it will change nothing
        yield _whole_call(policy, facts)
        return
    places = _places(facts)
    for path in paths:
        yield from _path_part(policy, facts, places, "path", path)


def _path_part(policy: Policy, facts: CallFacts, places: Places, name: str, value: object) -> Iterator[_Part]:
    if not value:  # a missing or empty path is the workspace (file_list, the git tools' repository)
        path: str | None = places.workspace
    else:
        path = places.resolve(value) if isinstance(value, str) else None
    shown = f"{name} {path or value!r}"
    candidates = _callers(policy.rules_for(facts.tool), facts.caller)
    rule = _deciding(candidates, functools.partial(_about_path, path=path, places=places))
    if rule is not None:
        yield _Part(rule.decision, rule.id, functools.partial(str, f"rule {rule.id!r} matched {shown}"), rule.approver)
    else:
        yield _Part(policy.default, DEFAULT_ID, functools.partial(str, f"no rule matched {shown}"))
    tilde = unknown_tilde(value) if isinstance(value, str) else None
    if tilde is not None:
        yield _opaque_part(policy, f"{name}: {tilde!r} names no user of this host, so the path is not known")


def _about_path(rule: Rule, *, path: str | None, places: Places) -> bool:
    if not rule.about_parts:
        return True
    return path is not None and any(glob.matches(path, places) for glob in rule.paths)


def _whole_call(policy: Policy, facts: CallFacts) -> _Part:
    candidates = _callers(policy.rules_for(facts.tool), facts.caller)
    rule = _deciding(candidates, _about_whole_calls)
    if rule is not None:
        describe = functools.partial(str, f"rule {rule.id!r} is about {facts.tool} calls")
        return _Part(rule.decision, rule.id, describe, rule.approver)
    return _Part(policy.default, DEFAULT_ID, functools.partial(str, f"no rule is about this {facts.tool} call"))


def _about_whole_calls(rule: Rule) -> bool:
    return not rule.about_parts


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
