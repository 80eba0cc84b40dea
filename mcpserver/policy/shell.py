"""What a shell command would run: the simple commands of its lists and pipelines, read with bashlex.

`parse_command(text)` gives a `ParsedCommand` (commands.py): each simple command that would run, in the order of
the text, with its argv, assignments, redirections (with those of an enclosing `{ }`, `( )`, loop or `if`) and the
pipelines it is a stage of. Commands are found in lists (`;`, `&&`, `||`, `&`), pipelines, subshells, groups,
`if`/`for`/`while`/`until` bodies and conditions, function bodies, and the `$( )`, backquote and `<( )`/`>( )`
substitutions of any word (arguments, assignments, redirection targets, `for` lists). What wrappers and shells
run inside is found by wrappers.py (`sudo env bash -c 'rm -r x'` lists all four commands); `cd DIR` is noted so
that later commands know where they may run.

The command is **opaque** (`opaque_reasons`) when the parse cannot see what would run: for the reasons wrappers.py
gives, and for a command name that holds an expansion, a glob or a brace expansion, a command substitution in a
here-document or inside `${…}`, nesting past MAX_DEPTH wrappers and scripts (or MAX_NESTING levels of syntax),
text longer than MAX_COMMAND_CHARS, more than MAX_SIMPLE_COMMANDS simple commands, and text bashlex cannot read.
bashlex 0.18 cannot read `[[ ]]`, `case`, `$(( ))`/`(( ))`, arrays, `select` or `coproc`: those are opaque too.
Parsed with `terminal` (a background command started with stdin or a pty), a command that runs what is typed into
that input later (`bash`, `python3`, `psql`) is opaque, and listed in `readers` (wrappers.py).

Cost: bashlex takes 40 to 60 µs a word or operator, and reads a command substitution again. So a hostile text is
refused before bashlex sees it: past MAX_COMMAND_CHARS characters, or past MAX_TOKENS words and operators over the
command and every script inside it (a substitution counting as five; a here-document's body as none, as bashlex is
not given it). That bounds one parse to ~0.1 s on a slow machine. Plain commands skip bashlex (plain.py, tested to
agree with it), and parses are cached by text.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, replace
from typing import Any

import bashlex.ast

from mcpserver.policy.bashlex_reading import MAX_TOKENS, Body, Reading, read_with_bashlex
from mcpserver.policy.commands import InputReader, ParsedCommand, Redirect, SimpleCommand
from mcpserver.policy.plain import PlainCommand, plain_commands
from mcpserver.policy.wrappers import ASSIGNMENT, Inner, Stdin, Word, cd_target, look_inside

MAX_COMMAND_CHARS = 16_384  # a longer text is opaque, unparsed
MAX_SIMPLE_COMMANDS = 200  # past this many the rest is not looked at, and the command is opaque
MAX_DEPTH = 8  # wrappers and nested scripts: `sudo env bash -c 'rm x'` is 3 deep
MAX_NESTING = 64  # levels of the syntax tree, so that `((((…))))` cannot exhaust the stack
MAX_REASONS = 8


@functools.lru_cache(maxsize=256)
def parse_command(text: str, terminal: bool = False) -> ParsedCommand:
    """The simple commands `text` would run when given to `bash -c`, and why it is opaque if it is. `terminal`:
    its input is one terminal_input types into (started with stdin or a pty), not /dev/null."""
    return read(text, terminal=terminal)


def read(text: str, plain: bool = True, terminal: bool = False) -> ParsedCommand:
    """`parse_command` uncached; `plain=False` has bashlex read plain commands too (to compare the two)."""
    walker = _Walker(plain)
    walker.script(text, _Context(terminal=terminal))
    return ParsedCommand(tuple(walker.commands), tuple(walker.reasons), tuple(walker.readers))


@dataclass(frozen=True)
class _Context:
    """What a command inherits from where it stands in the text."""

    reading: Reading | None = None  # bashlex's reading of the text being walked
    pipelines: tuple[tuple[int, int], ...] = ()
    redirects: tuple[Redirect, ...] = ()  # of enclosing compound commands, or of the command running a script
    depth: int = 0  # wrappers and scripts
    nesting: int = 0  # syntax tree levels
    more_args_unknown: bool = False  # under xargs
    placeholder_under: tuple[str, ...] = ()  # under find -exec
    terminal: bool = False  # stdin is the input terminal_input types into (substitutions inherit it too)

    def deeper(self) -> _Context:
        return replace(self, nesting=self.nesting + 1)

    def fresh(self, pipelines: tuple[tuple[int, int], ...] = ()) -> _Context:
        """The context of a substitution: a process of its own, with its own pipes and redirections."""
        return replace(self, pipelines=pipelines, redirects=(), nesting=self.nesting + 1)


_GLOB = re.compile(r"[*?]|\[.*\]")
_BRACES = re.compile(r"\{[^{}]*(?:,|\.\.)[^{}]*\}")
_SUBSTITUTION_IN_TEXT = re.compile(r"\$\(|`")
_EXPANDED_IN_BODY = re.compile(r"[$`\\]")  # what an unquoted here-document's body expands


class _Walker:
    """Collects the simple commands of one command text, and the reasons it is opaque."""

    def __init__(self, plain: bool = True) -> None:
        self.read_plain = plain
        self.tokens_left = MAX_TOKENS  # for bashlex, over all the scripts of the command
        self.commands: list[SimpleCommand] = []
        self.reasons: list[str] = []
        self.readers: list[InputReader] = []
        self.cwd_changes: list[str | None] = []
        self.pipelines = 0
        self.full = False

    def opaque(self, reason: str) -> None:
        if reason not in self.reasons and len(self.reasons) < MAX_REASONS:
            self.reasons.append(reason)

    def new_pipeline(self) -> int:
        self.pipelines += 1
        return self.pipelines - 1

    def script(self, text: str, ctx: _Context) -> None:
        """Walk the commands of shell text: the whole command, or a script run inside it."""
        if ctx.depth > MAX_DEPTH:
            self.opaque(f"wrappers or scripts are nested more than {MAX_DEPTH} deep")
            return
        if not text.strip():
            return  # nothing runs (bashlex fails on blank text)
        if len(text) > MAX_COMMAND_CHARS:
            self.opaque(f"the command is longer than {MAX_COMMAND_CHARS} characters")
            return
        plain = plain_commands(text, self.tokens_left) if self.read_plain else None
        if plain is not None:
            self.plain(plain, ctx)
            return
        parsed, cost = read_with_bashlex(text, self.tokens_left)
        self.tokens_left -= cost
        if isinstance(parsed, str):
            self.opaque(parsed)
            return
        ctx = replace(ctx, reading=parsed)
        for tree in parsed.trees:
            self.node(tree, ctx)

    def plain(self, pipelines: list[list[PlainCommand]], ctx: _Context) -> None:
        """Walk plain commands (plain.py) as their bashlex trees would be walked."""
        for stages in pipelines:
            pipeline = self.new_pipeline() if len(stages) > 1 else None
            for stage, command in enumerate(stages):
                at = ctx if pipeline is None else replace(ctx, pipelines=(*ctx.pipelines, (pipeline, stage)))
                words = command.words
                count = 0
                while count < len(words) and ASSIGNMENT.match(words[count]):
                    count += 1
                words_of = tuple(Word(word) for word in words[count:])
                self.simple(words_of, tuple(words[:count]), ctx.redirects + tuple(command.redirects), at)

    def node(self, node: Any, ctx: _Context) -> None:
        if self.full:
            return
        if ctx.nesting > MAX_NESTING:
            self.opaque(f"the command nests more than {MAX_NESTING} levels deep")
            return
        kind = node.kind
        if kind == "command":
            self.command(node, ctx)
        elif kind == "pipeline":
            self.pipeline(node, ctx.deeper())
        elif kind == "list":
            for part in node.parts:
                if part.kind != "operator":
                    self.node(part, ctx.deeper())
        elif kind == "compound":
            redirects = tuple(self.redirect(part, ctx) for part in getattr(node, "redirects", ()))
            inner = replace(ctx.deeper(), redirects=ctx.redirects + redirects)
            for part in node.list:
                if part.kind != "reservedword":
                    self.node(part, inner)
        elif kind in ("if", "while", "until", "for", "function"):
            for part in node.parts:
                if part.kind == "word":  # `for x in $(…)`: the words may run substitutions
                    self.word(part, ctx.deeper())
                elif part.kind != "reservedword":
                    self.node(part, ctx.deeper())
        elif kind not in ("operator", "pipe", "reservedword"):
            self.opaque(f"the shell construct {kind!r} is not inspected")

    def pipeline(self, node: Any, ctx: _Context) -> None:
        pipeline, stage = self.new_pipeline(), 0
        for part in node.parts:
            if part.kind == "pipe":
                stage += 1
            elif part.kind != "reservedword":  # `!`
                self.node(part, replace(ctx, pipelines=(*ctx.pipelines, (pipeline, stage))))

    def command(self, node: Any, ctx: _Context) -> None:
        words: list[Word] = []
        assignments: list[str] = []
        redirects = list(ctx.redirects)
        for part in node.parts:
            if part.kind == "word" and not words and self.assignment(part, ctx):
                assignments.append(self.word(part, ctx).text)
            elif part.kind == "word":
                words.append(self.word(part, ctx))
            elif part.kind == "assignment":
                assignments.append(self.word(part, ctx).text)
            elif part.kind == "redirect":
                redirects.append(self.redirect(part, ctx))
        self.simple(tuple(words), tuple(assignments), tuple(redirects), ctx)

    @staticmethod
    def assignment(node: Any, ctx: _Context) -> bool:
        """Whether a word bashlex did not call an assignment is one: bashlex 0.18 reads `>f A=1 cmd` as the
        command `A=1`, bash as an assignment before `cmd` (an unquoted `NAME=` before the command name)."""
        source = ctx.reading.source if ctx.reading is not None else ""
        return ASSIGNMENT.match(source, node.pos[0], node.pos[1]) is not None

    def word(self, node: Any, ctx: _Context) -> Word:
        """The word's text and what it holds, after walking the commands its substitutions run."""
        dynamic, substituted, homes = False, False, 0
        for part in getattr(node, "parts", ()):
            if part.kind == "commandsubstitution":
                dynamic = True
                self.substitution(part, ctx.fresh())
            elif part.kind == "processsubstitution":
                dynamic = substituted = True
                # `>(cmd)`: cmd reads what the command writes, as if piped to it.
                piped = ctx.reading is not None and ctx.reading.source[part.pos[0] : part.pos[0] + 1] == ">"
                self.substitution(part, ctx.fresh(((self.new_pipeline(), 1),) if piped else ()))
            elif part.kind == "parameter":
                value = str(getattr(part, "value", ""))
                if _SUBSTITUTION_IN_TEXT.search(value):
                    self.opaque("a command substitution inside ${…} is not inspected")
                homes += value == "HOME"
                dynamic = dynamic or value != "HOME"
        text = str(node.word)
        if homes == 1 and not dynamic:  # `> $HOME/.bashrc` is `> ~/.bashrc`: the agent's home is known
            for prefix in ("$HOME", "${HOME}"):
                if text.startswith(prefix) and "$" not in text[len(prefix) :]:
                    return Word("~" + text[len(prefix) :])
        return Word(text, dynamic or homes > 0, substituted)

    def substitution(self, part: Any, ctx: _Context) -> None:
        command = getattr(part, "command", None)
        if isinstance(command, bashlex.ast.node):
            self.node(command, ctx)

    def redirect(self, node: Any, ctx: _Context) -> Redirect:
        fd = node.input if isinstance(node.input, int) else None
        output = node.output
        if not isinstance(output, bashlex.ast.node):  # `2>&1`, `>&-`
            return Redirect(node.type, str(output), fd)
        word = self.word(output, ctx)
        if node.type in ("<<", "<<-"):
            return self.heredoc(node, word.text, fd, ctx)
        if node.type == "<<<":
            return Redirect(node.type, word.text, fd, word.dynamic, word.text + "\n", not word.dynamic)
        return Redirect(node.type, word.text, fd, word.dynamic)

    def heredoc(self, node: Any, delimiter: str, fd: int | None, ctx: _Context) -> Redirect:
        document = getattr(node, "heredoc", None)
        found = None
        if ctx.reading is not None and document is not None:
            found = ctx.reading.bodies.get(ctx.reading.original(document.pos[0]))
        if found is None:  # the prescan missed it: bashlex's text, its quoting unknown
            value = str(getattr(document, "value", ""))
            found = Body("" if value == delimiter else value.removesuffix("\n" + delimiter) + "\n", False)
        body = found.text
        literal = found.literal or not _EXPANDED_IN_BODY.search(body)
        if not literal and _SUBSTITUTION_IN_TEXT.search(body):
            self.opaque("a here-document runs command substitutions that are not inspected")
        return Redirect(node.type, delimiter, fd, False, body, literal)

    def simple(
        self, words: tuple[Word, ...], assignments: tuple[str, ...], redirects: tuple[Redirect, ...], ctx: _Context
    ) -> None:
        if self.full:
            return
        if len(self.commands) >= MAX_SIMPLE_COMMANDS:
            self.full = True
            self.opaque(f"the command runs more than {MAX_SIMPLE_COMMANDS} simple commands")
            return
        inners: list[Inner] = []
        transparent = False
        if words:
            self.check_name(words[0])
            if not words[0].dynamic:
                stdin = Stdin(
                    piped=any(stage > 0 for _, stage in ctx.pipelines),
                    source=next((redirect for redirect in reversed(redirects) if redirect.feeds_stdin), None),
                    terminal=ctx.terminal,
                )
                inside = look_inside(words, stdin)
                inners = inside.inners
                transparent = inside.transparent and bool(inners)
                for reason in inside.reasons:
                    self.opaque(reason)
                self.readers.extend(inside.readers)
        command = SimpleCommand(
            argv=tuple(word.text for word in words),
            assignments=assignments,
            redirects=redirects,
            pipelines=ctx.pipelines,
            dynamic=frozenset(at for at, word in enumerate(words) if word.dynamic),
            wrapper=transparent,
            cwd_changes=tuple(self.cwd_changes),
            more_args_unknown=ctx.more_args_unknown,
            placeholder_under=ctx.placeholder_under,
        )
        self.commands.append(command)
        if command.name in ("cd", "pushd", "popd"):
            self.cwd_changes.append(cd_target(words))
        for inner in inners:
            self.run(inner, redirects, replace(ctx, depth=ctx.depth + 1))

    def run(self, inner: Inner, redirects: tuple[Redirect, ...], ctx: _Context) -> None:
        """Walk what a command runs inside: its redirections and pipes are the inner commands' too."""
        if ctx.depth > MAX_DEPTH:
            self.opaque(f"wrappers or scripts are nested more than {MAX_DEPTH} deep")
            return
        if inner.more_args_unknown:
            ctx = replace(ctx, more_args_unknown=True)
        if inner.placeholder_under:
            ctx = replace(ctx, placeholder_under=inner.placeholder_under)
        if inner.script is not None:
            if inner.script_from_stdin:  # the inner shell's commands do not read that text again
                redirects = tuple(redirect for redirect in redirects if not redirect.feeds_stdin)
            self.script(inner.script, replace(ctx, redirects=redirects))
            return
        self.cwd_changes.extend(inner.chdir)
        self.simple(inner.words, inner.assignments, redirects, ctx)
        del self.cwd_changes[len(self.cwd_changes) - len(inner.chdir) :]

    def check_name(self, word: Word) -> None:
        if word.dynamic:
            self.opaque(f"the command name {word.text!r} is only known at run time")
        elif _GLOB.search(word.text) or _BRACES.search(word.text):
            self.opaque(f"the command name {word.text!r} is expanded by the shell")
