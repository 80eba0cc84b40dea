"""apply_patch's pure part: the patch format OpenAI's Codex models write, read into operations, and a file's hunks
applied to its text. No OS access here (patching.py reads and writes); the policy reads the paths of a patch with
the same parser (`patch_paths`), so that what it decides about is what the executor would touch.

The format, in words (Codex's grammar, `codex-rs/apply-patch`):

    *** Begin Patch
    *** Add File: <path>          then the new file, every line starting with `+`
    *** Delete File: <path>
    *** Update File: <path>
    *** Move to: <new path>        optional, right after Update File: the file is renamed too
    @@ <a line of the file>         an anchor, optional: the hunk's lines come after it
     context / -removed / +added    a hunk's lines
    *** End of File                optional, after a hunk's lines: they end the file
    *** End Patch

It is read as Codex reads it, leniently: markers may carry whitespace around them, a heredoc wrapper (`<<'EOF'` …
`EOF`) is taken off, the first hunk of a file may leave out its `@@`, an empty line in a hunk is an empty context
line, and blank lines between hunks or files are skipped. Beyond Codex: several `@@` lines in a row are sought one
after the other (Codex's instructions to its models describe them; its parser refuses them), a unified diff's
`@@ -12,3 +12,4 @@ text` counts as `@@ text`, a hunk that only adds lines after an anchor adds them right after it
(Codex appends them to the file), and an Update File with a Move to and no hunk only renames.

A hunk is found as Codex finds it: after the previous hunk (and after each of its anchors in turn), its old lines
(context and `-`) are sought exactly, then ignoring whitespace at the line ends, then at both ends, then with
typographic dashes, quotes and spaces read as their ASCII forms; the first position found wins, and a hunk ending
in `*** End of File` must match at the end of the file. Beyond Codex, context lines keep the file's own text (a
match that ignored whitespace does not rewrite them), and in a file whose lines end in CRLF the added lines do too.
As with Codex, the result ends with a newline.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from mcpserver.executor.edits import near_miss
from mcpserver.executor.interface import ToolFailure

BEGIN, END = "*** Begin Patch", "*** End Patch"
ADD, DELETE, UPDATE, MOVE = "*** Add File:", "*** Delete File:", "*** Update File:", "*** Move to:"
END_OF_FILE = "*** End of File"
HEREDOC_STARTS = ("<<EOF", "<<'EOF'", '<<"EOF"')
UNIFIED_HEADER = re.compile(r"@@ -\d+(?:,\d+)? \+\d+(?:,\d+)? @@ ?(.*)")
HEADERS = f"'{ADD} <path>', '{DELETE} <path>' or '{UPDATE} <path>'"
HUNK_LINES = "every line of a hunk starts with ' ' (context), '-' (removed) or '+' (added)"

# Typographic characters read as their ASCII forms by the last, most lenient match (as Codex's seek_sequence does).
_ASCII = str.maketrans(
    {
        **dict.fromkeys("\u2010\u2011\u2012\u2013\u2014\u2015\u2212", "-"),
        **dict.fromkeys("\u2018\u2019\u201a\u201b", "'"),
        **dict.fromkeys("\u201c\u201d\u201e\u201f", '"'),
        **dict.fromkeys("\u00a0\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u202f\u205f\u3000", " "),
    }
)
# Each match after the exact one compares lines normalized so.
_LENIENT: tuple[Callable[[str], str], ...] = (str.rstrip, str.strip, lambda line: line.strip().translate(_ASCII))


class PatchError(ToolFailure):
    """A patch that cannot be read, or a hunk that does not apply; nothing was written."""


@dataclass(frozen=True)
class Hunk:
    anchors: tuple[str, ...]  # the `@@` lines' text, sought in turn before the hunk's lines
    lines: tuple[tuple[str, str], ...]  # (" " context | "-" removed | "+" added, the line's text)
    end_of_file: bool
    at: int  # the patch's line where it starts (1-based)

    @property
    def old(self) -> list[str]:
        return [text for kind, text in self.lines if kind != "+"]


@dataclass(frozen=True)
class AddFile:
    path: str
    content: str
    at: int


@dataclass(frozen=True)
class DeleteFile:
    path: str
    at: int


@dataclass(frozen=True)
class UpdateFile:
    path: str
    move_to: str | None
    hunks: tuple[Hunk, ...]
    at: int


FileOp = AddFile | DeleteFile | UpdateFile


# --- reading a patch -----------------------------------------------------------------------------------------------


def parse_patch(text: str) -> tuple[FileOp, ...]:
    """The operations of a patch, in order; PatchError naming the patch's line where it cannot be read."""
    lines, first = _framed(text)
    ops: list[FileOp] = []
    index = 0
    while index < len(lines):
        if not lines[index].strip():
            index += 1
            continue
        op, index = _file_op(lines, index, first, ops[-1] if ops else None)
        ops.append(op)
    if not ops:
        raise PatchError(f"Error: invalid patch: it changes no file (nothing between '{BEGIN}' and '{END}')")
    return tuple(ops)


def patch_paths(text: str) -> list[str]:
    """Every path the patch names, as written: the files it adds, deletes and updates, and where it moves them."""
    paths: list[str] = []
    for op in parse_patch(text):
        paths.append(op.path)
        if isinstance(op, UpdateFile) and op.move_to is not None:
            paths.append(op.move_to)
    return paths


def _framed(text: str) -> tuple[list[str], int]:
    """The lines between Begin Patch and End Patch, and the patch line number of the first of them."""
    lines = [line.removesuffix("\r") for line in text.strip().split("\n")]
    first = 2
    heredoc = len(lines) >= 4 and lines[0].strip() in HEREDOC_STARTS and lines[-1].strip().endswith("EOF")
    if heredoc and lines[1].strip() == BEGIN:
        lines, first = lines[1:-1], 3
    if lines[0].strip() != BEGIN:
        raise PatchError(f"Error: invalid patch: its first line must be '{BEGIN}'{_diff_hint(lines[0])}")
    if len(lines) < 2 or lines[-1].strip() != END:
        raise PatchError(f"Error: invalid patch: its last line must be '{END}'")
    return lines[1:-1], first


def _diff_hint(line: str) -> str:
    if line.startswith(("diff --git", "--- ", "Index: ")):
        return (
            " (this looks like a unified diff, as git diff writes it; this tool takes the format its description shows)"
        )
    return ""


def _header(line: str, marker: str, number: int) -> str | None:
    """The path after `marker` on a file header line, None if the line is not one; PatchError if it has no path."""
    stripped = line.strip()
    if not stripped.startswith(marker):
        return None
    path = stripped[len(marker) :].strip()
    if not path:
        raise PatchError(f"Error: invalid patch: line {number}: '{marker}' names no path")
    return path


def _file_op(lines: list[str], index: int, first: int, previous: FileOp | None) -> tuple[FileOp, int]:
    number = index + first
    if (path := _header(lines[index], ADD, number)) is not None:
        end = index + 1
        while end < len(lines) and lines[end].startswith("+"):
            end += 1
        content = "".join(line[1:] + "\n" for line in lines[index + 1 : end])
        return AddFile(path, content, number), end
    if (path := _header(lines[index], DELETE, number)) is not None:
        return DeleteFile(path, number), index + 1
    if (path := _header(lines[index], UPDATE, number)) is not None:
        return _update(path, lines, index + 1, first, number)
    hint = "; every line of an added file starts with '+'" if isinstance(previous, AddFile) else ""
    if lines[index].strip() == END_OF_FILE:
        hint = f"; '{END_OF_FILE}' ends a hunk, after its lines"
    raise PatchError(
        f"Error: invalid patch: line {number}: {lines[index].strip()[:200]!r} is not a file header "
        f"(expected {HEADERS}){hint}"
    )


def _update(path: str, lines: list[str], index: int, first: int, number: int) -> tuple[UpdateFile, int]:
    move_to = _header(lines[index], MOVE, index + first) if index < len(lines) else None
    if move_to is not None:
        index += 1
    hunks: list[Hunk] = []
    while index < len(lines):
        line = lines[index]
        if not line.strip():
            index += 1  # blank lines between hunks
            continue
        if line.startswith("*"):
            break  # the next file's header (or a line the file level reports)
        hunk, index = _hunk(lines, index, first, not hunks)
        hunks.append(hunk)
    if not hunks and move_to is None:
        raise PatchError(
            f"Error: invalid patch: line {number}: '{UPDATE} {path}' has no hunk; give its changes as "
            "'@@' hunks of ' ', '-' and '+' lines"
        )
    return UpdateFile(path, move_to, tuple(hunks), number), index


def _anchor(line: str) -> str | None:
    """The anchor of an `@@` line ("" for a bare `@@`), or None for another line."""
    if line.rstrip() == "@@":
        return ""
    if not line.startswith("@@ "):
        return None
    unified = UNIFIED_HEADER.match(line)
    text = unified.group(1) if unified else line[3:]
    return text if text.strip() else ""


def _hunk(lines: list[str], index: int, first: int, first_of_file: bool) -> tuple[Hunk, int]:
    start = index
    anchors: list[str] = []
    while index < len(lines) and (anchor := _anchor(lines[index])) is not None:
        if anchor:
            anchors.append(anchor)
        index += 1
    if index == start and not first_of_file and lines[index][:1] in (" ", "-", "+"):
        raise PatchError(
            f"Error: invalid patch: line {index + first}: a hunk after '{END_OF_FILE}' starts with '@@' (Codex's rule)"
        )
    body: list[tuple[str, str]] = []
    end_of_file = False
    while index < len(lines):
        line = lines[index]
        if line.strip() == END_OF_FILE:
            if not body:
                raise PatchError(
                    f"Error: invalid patch: line {index + first}: '{END_OF_FILE}' must follow a hunk's lines"
                )
            end_of_file, index = True, index + 1
            break
        if line[:1] in (" ", "-", "+"):
            body.append((line[0], line[1:]))
        elif line == "":
            body.append((" ", ""))  # an empty context line whose leading space was lost
        else:
            break
        index += 1
    if not body and index < len(lines):
        raise PatchError(f"Error: invalid patch: line {index + first}: {lines[index][:200]!r}: {HUNK_LINES}")
    if not body:
        raise PatchError(f"Error: invalid patch: line {start + first}: the hunk has no lines; {HUNK_LINES}")
    return Hunk(tuple(anchors), tuple(body), end_of_file, start + first), index


# --- applying a file's hunks ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Patched:
    text: str
    added: int  # `+` lines written
    removed: int  # `-` lines removed


def apply_hunks(text: str, hunks: Sequence[Hunk], path: str) -> Patched:
    """`text` (a file's, decoded, without a BOM) with the hunks applied; PatchError saying which hunk did not apply,
    where it was sought, and the closest region of the file with how it differs."""
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()  # the file's final newline
    crlf = bool(lines) and lines[0].endswith("\r")  # as the first line ends, as file_edit decides
    finder = _Finder([line.removesuffix("\r") for line in lines] if crlf else lines)
    changes: list[tuple[int, int, tuple[tuple[str, str], ...]]] = []
    cursor = 0
    for number, hunk in enumerate(hunks, 1):
        where = (
            f"Error: {path}: hunk {number} of {len(hunks)} (patch line {hunk.at}) did not apply, so no file was changed"
        )
        for anchor in hunk.anchors:
            found = finder.seek([anchor], cursor, False)
            if found is None:
                raise PatchError(_anchor_missing(where, anchor, finder, cursor))
            cursor = found + 1
        body, old = hunk.lines, hunk.old
        found = finder.seek(old, cursor, hunk.end_of_file) if old else None
        while found is None and old and old[-1] == "":
            # A trailing empty line may stand for the file's final newline: sought again without it, as Codex does.
            body = _without_last_old_line(body)
            old = [line for kind, line in body if kind != "+"]
            found = finder.seek(old, cursor, hunk.end_of_file) if old else None
        if not old:  # only additions: after the anchor, or at the end of the file
            changes.append((cursor if hunk.anchors else len(lines), 0, body))
            continue
        if found is None:
            raise PatchError(_hunk_missing(where, hunk, finder, cursor))
        changes.append((found, len(old), body))
        cursor = found + len(old)
    changes.sort(key=lambda change: change[0])  # an addition at the end may come before later hunks
    return _rebuilt(lines, changes, crlf)


def _without_last_old_line(body: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    last = max(index for index, (kind, _text) in enumerate(body) if kind != "+")
    return body[:last] + body[last + 1 :]


def _rebuilt(lines: list[str], changes: list[tuple[int, int, tuple[tuple[str, str], ...]]], crlf: bool) -> Patched:
    out: list[str] = []
    ending = "\r" if crlf else ""
    position = added = removed = 0
    for start, count, body in changes:
        out.extend(lines[position:start])
        at = start
        for kind, text in body:
            if kind == " ":
                out.append(lines[at])  # the file's own line, whatever whitespace the match forgave
                at += 1
            elif kind == "-":
                at += 1
                removed += 1
            else:
                out.append(text + ending)
                added += 1
        position = start + count
    out.extend(lines[position:])
    if crlf and out and not out[-1].endswith("\r"):
        out[-1] += "\r"
    return Patched("".join(line + "\n" for line in out), added, removed)


class _Finder:
    """Where a run of lines occurs in a file, from a line on, as Codex seeks it: exact, then more and more lenient."""

    def __init__(self, lines: list[str]) -> None:
        self.lines = lines
        self._normalized: dict[int, list[str]] = {}

    def seek(self, pattern: list[str], start: int, end_of_file: bool) -> int | None:
        for tier in range(len(_LENIENT) + 1):
            found = _find(self._tier(tier), self._pattern(pattern, tier), start, end_of_file)
            if found is not None:
                return found
        return None

    def _tier(self, tier: int) -> list[str]:
        if tier == 0:
            return self.lines
        found = self._normalized.get(tier)
        if found is None:  # computed once per file, only when an exact match failed
            found = self._normalized[tier] = list(map(_LENIENT[tier - 1], self.lines))
        return found

    @staticmethod
    def _pattern(pattern: list[str], tier: int) -> list[str]:
        return pattern if tier == 0 else list(map(_LENIENT[tier - 1], pattern))


def _find(lines: list[str], pattern: list[str], start: int, end_of_file: bool) -> int | None:
    last = len(lines) - len(pattern)
    if last < start:
        return None
    if end_of_file:
        return last if lines[last:] == pattern else None
    at = start
    while True:
        try:
            at = lines.index(pattern[0], at, last + 1)  # in C: the first line's candidates, then the whole run
        except ValueError:
            return None
        if lines[at : at + len(pattern)] == pattern:
            return at
        at += 1


def _anchor_missing(where: str, anchor: str, finder: _Finder, cursor: int) -> str:
    after = f" after line {cursor}" if cursor else ""
    head = f"{where}: its @@ line {anchor.strip()[:200]!r} matches no line of the file{after}"
    earlier = finder.seek([anchor], 0, False) if cursor else None
    if earlier is not None:
        return f"{head}; it matches line {earlier + 1}, before that: give the hunks in the order of the file"
    near = near_miss(finder.lines, [anchor], "the @@ line")
    return head + (near if near is not None else "; nothing like it either (read the file again)")


def _hunk_missing(where: str, hunk: Hunk, finder: _Finder, cursor: int) -> str:
    old = hunk.old
    after = f" after line {cursor}" if cursor else ""
    count = f"{len(old)} line{'s' if len(old) != 1 else ''}"
    head = f"{where}: its {count} of context and '-' were not found{after}"
    if hunk.end_of_file:
        head = f"{where}: its {count} of context and '-' are not the end of the file, as '{END_OF_FILE}' says"
        elsewhere = finder.seek(old, cursor, False)
        if elsewhere is not None:
            return f"{head}; they occur at line {elsewhere + 1}"
    earlier = finder.seek(old, 0, False) if cursor else None
    if earlier is not None and earlier < cursor:
        return f"{head}; they occur at line {earlier + 1}, before that: give the hunks in the order of the file"
    near = near_miss(finder.lines, old, "the hunk")
    return head + (near if near is not None else "; no similar region either (read the file again)")
