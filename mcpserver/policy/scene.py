"""One parsed command seen from where it runs: each simple command's options and operands, the directories it may
run in, the paths its words name and the pipelines it shares. Built once per call; everything is computed lazily
and kept, since several rules ask the same questions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from mcpserver.policy.commands import ParsedCommand, SimpleCommand
from mcpserver.policy.paths import Places, normalise, resolve

MAX_CWDS = 16  # directories a command may run in after `cd`s; past this its relative paths count as unknown


@dataclass(frozen=True)
class Shape:
    """A command's arguments, sorted: the letters of its short option clusters, its long options, its operands."""

    letters: frozenset[str]
    longs: frozenset[str]
    operands: tuple[tuple[str, bool], ...]  # (text, only known at run time)


@dataclass(frozen=True)
class Resolved:
    """The absolute paths a word may name, and whether it may name one that cannot be known here."""

    paths: tuple[str, ...]
    unknown: bool


def shape_of(command: SimpleCommand) -> Shape:
    letters: set[str] = set()
    longs: set[str] = set()
    operands: list[tuple[str, bool]] = []
    options = True
    for index, arg in enumerate(command.argv[1:], start=1):
        if options and arg == "--":
            options = False
        elif options and arg.startswith("--"):
            longs.add(arg[2:].partition("=")[0])
        elif options and arg.startswith("-") and len(arg) > 1:
            letters.update(arg[1:])
        else:
            operands.append((arg, index in command.dynamic))
    return Shape(frozenset(letters), frozenset(longs), tuple(operands))


class Scene:
    def __init__(self, parsed: ParsedCommand, places: Places, cwd_known: bool = True) -> None:
        """`cwd_known=False`: the command may run anywhere (a line typed into a shell that may have changed
        directory since it started): its relative paths are unknown."""
        self.commands: Sequence[SimpleCommand] = parsed.commands
        self.places = places
        self.cwd_known = cwd_known
        self._shapes: dict[int, Shape] = {}
        self._cwds: dict[int, Resolved] = {}
        self._members: dict[int, list[tuple[int, int]]] | None = None

    def shape(self, index: int) -> Shape:
        found = self._shapes.get(index)
        if found is None:
            found = self._shapes[index] = shape_of(self.commands[index])
        return found

    def cwds(self, index: int) -> Resolved:
        """The directories command `index` may run in: the call's, and every one a `cd` before it may lead to."""
        found = self._cwds.get(index)
        if found is None:
            found = self._cwds[index] = self._possible_cwds(self.commands[index])
        return found

    def _possible_cwds(self, command: SimpleCommand) -> Resolved:
        # A union, not a sequence: `cd x || rm -r y` runs rm where cd failed, and loops repeat cds.
        cwds = {self.places.cwd}
        unknown = not self.cwd_known
        for target in command.cwd_changes:
            moved = {resolve(target, cwd, self.places.home) for cwd in cwds} if target is not None else {None}
            unknown = unknown or None in moved
            cwds |= {cwd for cwd in moved if cwd is not None}
            if len(cwds) > MAX_CWDS:
                return Resolved((self.places.cwd,), True)
        return Resolved(tuple(sorted(cwds)), unknown)

    def paths(self, index: int, word: str, dynamic: bool) -> Resolved:
        """The absolute paths `word`, an argument or redirection target of command `index`, may name."""
        if dynamic:
            return Resolved((), True)
        command = self.commands[index]
        words = [word]
        if command.placeholder_under and "{}" in word:  # find -exec: `{}` is a path below a starting point
            words = [word.replace("{}", f"{start}/{{}}") for start in command.placeholder_under]
        if all(text.startswith(("/", "~")) for text in words):
            resolved = [resolve(text, self.places.cwd, self.places.home) for text in words]
            return Resolved(tuple(path for path in resolved if path is not None), None in resolved)
        cwds = self.cwds(index)
        found: list[str] = []
        unknown = cwds.unknown
        for text in words:
            for cwd in cwds.paths:
                path = resolve(text, cwd, self.places.home)
                unknown = unknown or path is None
                if path is not None:
                    found.append(path)
        return Resolved(tuple(dict.fromkeys(found)), unknown)

    def outside(self, index: int, inside: str) -> bool:
        """Whether an operand of command `index` may name a path outside every git repository (`inside` is
        "repos") or outside the workspace ("workspace"). What cannot be known counts as outside."""
        command = self.commands[index]
        if command.more_args_unknown:
            return True
        check = self.places.in_repository if inside == "repos" else self.places.in_workspace
        for text, dynamic in self.shape(index).operands:
            resolved = self.paths(index, text, dynamic)
            if resolved.unknown or not all(check(path) for path in resolved.paths):
                return True
        return False

    def before(self, index: int) -> list[list[tuple[int, int]]]:
        """For each pipeline command `index` is a stage of: the (stage, command) of its earlier stages, in order."""
        if self._members is None:
            members: dict[int, list[tuple[int, int]]] = {}
            for at, command in enumerate(self.commands):
                for pipeline, stage in command.pipelines:
                    members.setdefault(pipeline, []).append((stage, at))
            self._members = members
        return [
            sorted(member for member in self._members[pipeline] if member[0] < stage)
            for pipeline, stage in self.commands[index].pipelines
        ]


def start_directory(cwd: object, workspace: str, home: str) -> str:
    """The directory a command tool starts in: its `cwd` argument (absolute, or relative to the workspace), else
    the workspace."""
    if not isinstance(cwd, str) or not cwd:
        return workspace
    return resolve(cwd, workspace, home) or normalise(f"{workspace}/{cwd}")
