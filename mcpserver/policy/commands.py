"""What a shell command runs, as the parser (shell.py) reports it: simple commands, their words and redirections."""

from __future__ import annotations

import functools
import posixpath
from dataclasses import dataclass

_WRITE_OPERATORS = frozenset({">", ">>", ">|", "&>", "&>>", "<>"})
_READ_OPERATORS = frozenset({"<", "<<", "<<-", "<<<", "<>"})


@dataclass(frozen=True)
class Redirect:
    operator: str  # as written: `>`, `>>`, `&>`, `>|`, `<`, `<<`, `<<<`, `>&`, …
    target: str  # the file (quotes removed), a duplicated descriptor (`1`, `-`), a here-document's delimiter
    fd: int | None = None  # the descriptor redirected, when written (`2>`)
    dynamic: bool = False  # the target holds an expansion
    body: str | None = None  # what a here-document or here-string feeds in
    literal: bool = True  # the body is exactly that text: nothing in it is expanded

    @property
    def writes(self) -> bool:
        """Whether it writes to the file `target` names."""
        if self.operator == ">&":  # `>&file` is `&>file`; `>&2` and `>&-` duplicate or close a descriptor
            return not (self.target.isdigit() or self.target == "-")
        return self.operator in _WRITE_OPERATORS

    @property
    def feeds_stdin(self) -> bool:
        return self.operator in _READ_OPERATORS and self.fd in (None, 0)


@dataclass(frozen=True)
class SimpleCommand:
    """One command that would run, with the facts a rule may ask about."""

    argv: tuple[str, ...]  # quotes removed; a word with an expansion keeps its `$…` text
    assignments: tuple[str, ...] = ()
    redirects: tuple[Redirect, ...] = ()  # its own, after those of enclosing groups, loops and wrappers
    pipelines: tuple[tuple[int, int], ...] = ()  # (pipeline, stage) for every pipeline it is a stage of
    dynamic: frozenset[int] = frozenset()  # indices of argv words only known at run time
    # It only runs a command listed after it, which says what it does (env, nohup, timeout, bash -c …; not sudo,
    # doas, su, pkexec or chroot, which change who runs it or where).
    wrapper: bool = False
    cwd_changes: tuple[str | None, ...] = ()  # `cd` targets met before it (None: unknown); it may run in any
    more_args_unknown: bool = False  # xargs adds arguments only known at run time
    placeholder_under: tuple[str, ...] = ()  # under find -exec: `{}` stands for paths below these

    @functools.cached_property
    def name(self) -> str:
        """The command's name without its directory (`/usr/bin/rm` is `rm`); "" when it has no words."""
        return posixpath.basename(self.argv[0]) if self.argv else ""

    @property
    def text(self) -> str:
        return " ".join(self.assignments + self.argv)


@dataclass(frozen=True)
class InputReader:
    """A command that reads the commands it runs from the input terminal_input types into (`bash` started with
    stdin or a pty), so that what is typed there later is a command too."""

    name: str
    shell: bool  # what it reads is shell text (else another language: python, SQL, …)


@dataclass(frozen=True)
class ParsedCommand:
    commands: tuple[SimpleCommand, ...]
    opaque_reasons: tuple[str, ...] = ()  # why some of what would run cannot be seen, one sentence each
    readers: tuple[InputReader, ...] = ()  # when parsed with its input open (`terminal`): what reads it

    @property
    def opaque(self) -> bool:
        return bool(self.opaque_reasons)
