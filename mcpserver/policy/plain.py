"""The common case without bashlex: commands of plain words, list and pipe operators, and simple redirections.

bashlex costs ~50 µs a token; most commands an agent runs are plain words (`git status`, `cd src && npm test`,
`pytest -x 2>&1 | tail -20`), which need no parser. `plain_commands(text, max_tokens)` reads exactly those texts,
as bashlex reads them (tests/test_policy_shell.py compares the two over many commands), and gives None for any
other text, which bashlex then reads: quotes, `$`, backquotes, backslashes, parentheses, braces, `#`, `!`,
newlines, here-documents, `<>`, `>|`, `|&`, reserved words, syntax errors, and more than `max_tokens` tokens.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from mcpserver.policy.commands import Redirect

_RESERVED = frozenset(
    {"!", "case", "coproc", "do", "done", "elif", "else", "esac", "fi", "for", "function", "if", "in", "select"}
    | {"then", "time", "until", "while", "{", "}", "[[", "]]"}
)
# Characters no shell quotes, expands (globs apart: a command keeps them as written) or reads as syntax, blanks,
# and the characters of the operators read below.
_PLAIN_TEXT = re.compile(r"[A-Za-z0-9_./:=@%+,~^*?\[\]\- \t;&|<>]*")
_TOKEN = re.compile(
    r"(?P<dup>[0-9]*>&(?:[0-9]+|-))(?=[ \t;&|]|$)"  # 2>&1, >&-
    r"|(?P<redirect>[0-9]*>>?|&>>?|[0-9]*<)"  # then a file
    r"|(?P<operator>&&|\|\||[;&|])"
    r"|(?P<word>[^ \t;&|<>]+)"
    r"|(?P<blank>[ \t]+)"
    r"|(?P<other>.)"
)
_UNREAD = ("<<", "<>", ">|", "|&", ">>>", "&>&")


@dataclass
class PlainCommand:
    words: list[str] = field(default_factory=list)
    redirects: list[Redirect] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.words and not self.redirects


def plain_commands(text: str, max_tokens: int) -> list[list[PlainCommand]] | None:
    """The pipelines (each a list of its stages) of a plain text, or None when bashlex must read it (or refuse
    it: past `max_tokens` words and operators)."""
    if not _PLAIN_TEXT.fullmatch(text) or any(sequence in text for sequence in _UNREAD):
        return None
    pipelines: list[list[PlainCommand]] = []
    stages = [PlainCommand()]
    pending: str | None = None  # a redirection operator waiting for its file
    last = ""
    for match in _TOKEN.finditer(text):
        kind, token = match.lastgroup, match.group()
        if kind == "blank":
            continue
        max_tokens -= 1
        if max_tokens < 0:
            return None
        last = token
        if kind == "other" or (pending is not None and kind != "word"):
            return None  # a redirection without its file, or a sequence bashlex should judge
        if kind == "word":
            if pending is not None:
                stages[-1].redirects.append(_redirect(pending, token))
                pending = None
            elif token in _RESERVED:
                return None
            else:
                stages[-1].words.append(token)
        elif kind == "dup":
            operator_at = token.index(">")
            fd = int(token[:operator_at]) if operator_at else None
            stages[-1].redirects.append(Redirect(">&", token[operator_at + 2 :], fd))
        elif kind == "redirect":
            pending = token
        elif stages[-1].empty:
            return None  # an operator with no command before it: bashlex reports the syntax error
        elif token == "|":
            stages.append(PlainCommand())
        else:
            pipelines.append(stages)
            stages = [PlainCommand()]
    if pending is not None or last in ("&&", "||", "|"):
        return None  # bashlex reports the syntax error
    if not stages[-1].empty:
        pipelines.append(stages)
    elif len(stages) > 1:
        return None  # a pipe with nothing after it
    return pipelines


def _redirect(operator: str, target: str) -> Redirect:
    digits = len(operator) - len(operator.lstrip("0123456789"))
    return Redirect(operator[digits:], target, int(operator[:digits]) if digits else None)
