"""The command pattern language of policy rules.

A pattern is shell words, quoted as in a shell (`'a b'` is one word). In any word, `|` separates alternatives.

- The first word is a glob over the command's name without its directory: `rm` matches `/usr/bin/rm`, `mkfs.*`
  matches `mkfs.ext4`, `sudo|doas|su` any of them. (A pattern whose first word is a redirection has no name word:
  it is about any command.)
- `-x`: a short option. It matches any argument cluster holding the letter: `-r` matches `-rf`, `-fr`, `-Rr`.
  `-rf` needs both letters, in one cluster or in several.
- `--name`: a long option, matching `--name`, `--name=value` and abbreviations of two letters or more (`--recur`
  for `--recursive`), which GNU tools and git accept.
- `>GLOB` (or `>> GLOB`, `> GLOB`): a redirection writing to a file (`>`, `>>`, `&>`, `&>>`, `>|`, `<>`, `>&file`)
  whose target matches the path glob. The target is resolved from the directory the command runs in (the call's
  `cwd`, and any `cd` before it in the command); in the glob `~` is the agent's home and a relative glob is
  relative to the workspace (paths.py).
- `KEY=GLOB`: an operand `KEY=value` anywhere (dd's `of=/dev/sd*`); the value is matched as a path when the glob
  starts with `/` or `~`.
- Any other word: a glob over an operand (an argument that is not an option). These words match operands in
  order, not necessarily adjacent, so `git push` matches `git -C repo push origin`. A command's option values
  cannot be told from its operands, so they count as operands: a pattern errs on the side of matching. A word
  starting with `/` or `~` is a path glob, matched against the operand resolved like a redirection target.
- Options may come anywhere after the name; arguments after `--` are operands whatever they look like. A word
  only known at run time (`$FLAGS`) is an operand, never an option.
- A word that is `|` alone makes a pipeline pattern: `curl|wget | sh|bash` matches a command matching `sh|bash`
  that a command matching `curl|wget` precedes in a pipeline (`curl x | tee f | sudo bash` too).

A pattern may carry a condition, `when`: `outside-repos` holds when an operand may name a path that is not strictly
inside a known git repository (a repository's own root counts as outside: removing a whole repository is worth a
question), `outside-workspace` when it may name one outside the workspace. An operand only known at run time, and
xargs' added arguments, count as outside.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

from mcpserver.policy.paths import PathGlob, glob_regex
from mcpserver.policy.scene import Scene

CONDITIONS = {"outside-repos": "repos", "outside-workspace": "workspace"}


class PatternError(ValueError):
    """A pattern that cannot be read; the message says why."""


@dataclass(frozen=True)
class _Option:
    letters: frozenset[str] = frozenset()  # a short option (all of these letters)
    long: str = ""  # or a long option

    def found(self, letters: frozenset[str], longs: frozenset[str]) -> bool:
        if not self.long:
            return self.letters <= letters
        # GNU getopt and git take an unambiguous abbreviation: `--recur` is `--recursive`.
        return self.long in longs or any(len(given) >= 2 and self.long.startswith(given) for given in longs)


@dataclass(frozen=True)
class _Operand:
    """One alternative of an operand word: a glob over the text, a path glob, or a `KEY=` prefix and either."""

    key: str = ""
    text: re.Pattern[str] | None = None
    path: PathGlob | None = None

    def matches(self, scene: Scene, index: int, operand: tuple[str, bool]) -> bool:
        text, dynamic = operand
        if self.key:
            if not text.startswith(self.key):
                return False
            text = text[len(self.key) :]
        if self.path is not None:
            resolved = scene.paths(index, text, dynamic)
            return any(self.path.matches(path, scene.places) for path in resolved.paths)
        return self.text is not None and self.text.fullmatch(text) is not None


@dataclass(frozen=True)
class _Stage:
    """The pattern for one command: its name, options, operands and redirections."""

    name: re.Pattern[str]
    options: tuple[tuple[_Option, ...], ...] = ()  # each: alternatives
    in_order: tuple[tuple[_Operand, ...], ...] = ()
    anywhere: tuple[tuple[_Operand, ...], ...] = ()
    writes: tuple[tuple[PathGlob, ...], ...] = ()

    def matches(self, scene: Scene, index: int) -> bool:
        command = scene.commands[index]
        if self.name.fullmatch(command.name) is None:
            return False
        if self.writes and not any(redirect.writes for redirect in command.redirects):
            return False  # the quick answer for patterns about redirections, which name any command
        shape = scene.shape(index)
        for options in self.options:
            if not any(option.found(shape.letters, shape.longs) for option in options):
                return False
        at = 0
        for word in self.in_order:
            while at < len(shape.operands) and not _any(word, scene, index, shape.operands[at]):
                at += 1
            if at == len(shape.operands):
                return False
            at += 1
        for word in self.anywhere:
            if not any(_any(word, scene, index, operand) for operand in shape.operands):
                return False
        return all(self._writes_to(globs, scene, index) for globs in self.writes)

    @staticmethod
    def _writes_to(globs: tuple[PathGlob, ...], scene: Scene, index: int) -> bool:
        for redirect in scene.commands[index].redirects:
            if redirect.writes:
                resolved = scene.paths(index, redirect.target, redirect.dynamic)
                if any(glob.matches(path, scene.places) for glob in globs for path in resolved.paths):
                    return True
        return False


def _any(alternatives: tuple[_Operand, ...], scene: Scene, index: int, operand: tuple[str, bool]) -> bool:
    return any(alternative.matches(scene, index, operand) for alternative in alternatives)


@dataclass(frozen=True)
class CommandPattern:
    """A pattern as written (`text`, `when`) and as compiled (`stages`, the last one being the command matched)."""

    text: str
    when: str | None = None
    stages: tuple[_Stage, ...] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.when is not None and self.when not in CONDITIONS:
            raise PatternError(f"unknown condition {self.when!r} (known: {', '.join(CONDITIONS)})")
        object.__setattr__(self, "stages", _compile(self.text))

    def matches(self, scene: Scene, index: int) -> bool:
        """Whether the pattern matches command `index` of the scene (as the last stage of a pipeline pattern)."""
        if not self.stages[-1].matches(scene, index):
            return False
        if len(self.stages) > 1 and not any(self._preceded(scene, group) for group in scene.before(index)):
            return False
        return self.when is None or scene.outside(index, CONDITIONS[self.when])

    def _preceded(self, scene: Scene, earlier: list[tuple[int, int]]) -> bool:
        """Whether the earlier stages of this pattern match commands of `earlier` stages, in order."""
        last_stage, at = -1, 0
        for stage in self.stages[:-1]:
            while at < len(earlier) and (earlier[at][0] <= last_stage or not stage.matches(scene, earlier[at][1])):
                at += 1
            if at == len(earlier):
                return False
            last_stage = earlier[at][0]
        return True


def _compile(text: str) -> tuple[_Stage, ...]:
    try:
        words = shlex.split(text)
    except ValueError as error:
        raise PatternError(f"cannot read {text!r} as shell words ({error})") from error
    if not words:
        raise PatternError("a pattern needs at least a command name")
    stages: list[list[str]] = [[]]
    for word in words:
        if word == "|":
            stages.append([])
        else:
            stages[-1].append(word)
    if any(not stage for stage in stages):
        raise PatternError(f"{text!r}: each side of a `|` needs a command")
    return tuple(_stage(stage) for stage in stages)


def _stage(words: list[str]) -> _Stage:
    first = words[0]
    if first.startswith(">"):
        name = "*"
    else:
        name, words = first, words[1:]
        if "/" in name:
            raise PatternError(f"{name!r}: a command is matched by its name, without a directory")
    options: list[tuple[_Option, ...]] = []
    in_order: list[tuple[_Operand, ...]] = []
    anywhere: list[tuple[_Operand, ...]] = []
    writes: list[tuple[PathGlob, ...]] = []
    index = 0
    while index < len(words):
        word = words[index]
        if word.startswith(">"):
            target = word.lstrip(">")
            if not target:
                index += 1
                if index == len(words):
                    raise PatternError("`>` needs a path glob after it")
                target = words[index]
            writes.append(tuple(PathGlob(glob) for glob in _alternatives(target)))
        elif word.startswith("-") and len(word) > 1:
            options.append(_options(word))
        elif "=" in word.split("|")[0] and not word.startswith(("/", "~")):
            anywhere.append(_operands(word, keyed=True))
        else:
            in_order.append(_operands(word, keyed=False))
        index += 1
    names = "|".join(f"(?:{glob_regex(alternative).pattern})" for alternative in _alternatives(name))
    return _Stage(re.compile(names, re.DOTALL), tuple(options), tuple(in_order), tuple(anywhere), tuple(writes))


def _alternatives(word: str) -> list[str]:
    parts = word.split("|")
    if any(not part for part in parts):
        raise PatternError(f"{word!r}: an empty alternative")
    return parts


def _options(word: str) -> tuple[_Option, ...]:
    found: list[_Option] = []
    for alternative in _alternatives(word):
        if alternative.startswith("--") and len(alternative) > 2:
            found.append(_Option(long=alternative[2:]))
        elif alternative.startswith("-") and len(alternative) > 1 and not alternative.startswith("--"):
            found.append(_Option(letters=frozenset(alternative[1:])))
        else:
            raise PatternError(f"{word!r}: alternatives of an option must all be options")
    return tuple(found)


def _operands(word: str, keyed: bool) -> tuple[_Operand, ...]:
    found: list[_Operand] = []
    for alternative in _alternatives(word):
        key = ""
        if keyed:
            key, equals, alternative = alternative.partition("=")
            if not equals:
                raise PatternError(f"{word!r}: each alternative needs the same form, KEY=GLOB")
            key += "="
        found.append(_operand(key, alternative))
    return tuple(found)


def _operand(key: str, glob: str) -> _Operand:
    if glob.startswith(("/", "~")):
        return _Operand(key=key, path=PathGlob(glob))
    return _Operand(key=key, text=glob_regex(glob))
