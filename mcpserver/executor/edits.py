"""file_edit's pure part: exact string replacement, the diagnostic when it does not match, and the diff shown.

No OS access here (editing.py reads and writes). Everything stays linear in the file's size: matching is
str.find/str.count, the no-match search compares normalized copies (each line normalized on its own, so line numbers
carry over) before it falls back to a bounded line scan, and the diff is computed only between the first and last
changed lines.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from mcpserver.executor.interface import ToolFailure

MAX_LINES_LISTED = 20  # line numbers of several matches, at most
MAX_DIAGNOSTIC_LINES = 30  # lines of the closest region compared in the no-match diagnostic
FUZZY_SCAN_LINES = 200_000  # lines the similarity fallback looks at, at most (its cost is per line)
CONTEXT = 3
BLOCK = 1 << 16  # bytes compared at a time when finding where two texts start to differ


@dataclass(frozen=True)
class Edit:
    old_string: str
    new_string: str
    replace_all: bool = False


Piece = bytes | memoryview


@dataclass(frozen=True)
class Applied:
    """The edited file as pieces written one after another: a single edit of a large file is the original's head
    and tail (views, not copies) around the new string, so no second copy of the file is ever made."""

    pieces: tuple[Piece, ...]
    replacements: int
    head: int  # bytes at the start the same as before the edit (at least)
    tail: int  # and at the end

    @classmethod
    def of(cls, before: bytes, after: bytes, replacements: int) -> Applied:
        head = _common_prefix(before, after)
        return cls((after,), replacements, head, _common_suffix(before, after, min(len(before), len(after)) - head))

    @property
    def size(self) -> int:
        return sum(len(piece) for piece in self.pieces)

    @property
    def data(self) -> bytes:
        return b"".join(self.pieces)

    def slice(self, start: int, end: int) -> bytes:
        """The edited file's bytes from `start` to `end`, without joining the whole of it."""
        found, offset = [], 0
        for piece in self.pieces:
            if offset < end and offset + len(piece) > start:
                found.append(bytes(piece[max(start - offset, 0) : end - offset]))
            offset += len(piece)
        return b"".join(found)


def apply_edits(data: bytes, edits: list[Edit], path: str) -> Applied:
    """All `edits` applied in order to `data` (valid UTF-8, without a BOM); ToolFailure naming the failing edit
    (1-based) when there are several.

    The matching is done on the UTF-8 bytes: in valid UTF-8 a string's encoding occurs exactly where the string
    does, and the file need not be decoded and encoded again (a 10 MB file: two copies and milliseconds saved).
    """
    if not edits:
        raise ToolFailure("Error: no edits given")
    crlf = _crlf(data)
    current: bytes | Applied = data
    total = 0
    for index, edit in enumerate(edits, 1):
        where = f"edit {index} of {len(edits)}: " if len(edits) > 1 else ""
        text = current.data if isinstance(current, Applied) else current
        try:
            current = _apply_one(text, edit, crlf, path)
        except ToolFailure as failure:
            first, newline, rest = str(failure).removeprefix("Error: ").partition("\n")
            written = "; nothing was written" if where else ""  # said on the first line, before any diagnostic
            raise ToolFailure(f"Error: {where}{first}{written}{newline}{rest}") from None
        total += current.replacements
    assert isinstance(current, Applied)
    if len(edits) == 1:
        return current
    return Applied.of(data, current.data, total)


def _crlf(data: bytes) -> bool:
    """Whether the file's lines end in CRLF, as its first line's does (a scan of the whole file would cost more)."""
    first = data.find(b"\n")
    return first > 0 and data[first - 1 : first] == b"\r"


def _apply_one(data: bytes, edit: Edit, crlf: bool, path: str) -> Applied:
    old_text, new_text = edit.old_string, edit.new_string
    if not old_text:
        raise ToolFailure("Error: old_string is empty; give the exact text to replace")
    if old_text == new_text:
        raise ToolFailure("Error: old_string and new_string are the same; nothing to change")
    if crlf and "\r" not in old_text:
        # The agent saw the file's lines without their \r: match and write them with the file's CRLF endings.
        old_text = old_text.replace("\n", "\r\n")
        if "\r" not in new_text:
            new_text = new_text.replace("\n", "\r\n")
    old, new = _encoded(old_text, "old_string"), _encoded(new_text, "new_string")
    first = data.find(old)
    if first < 0:
        raise ToolFailure(no_match_message(data.decode("utf-8"), edit.old_string, path))
    end = first + len(old)
    if not edit.replace_all and data.find(old, end) < 0:
        view = memoryview(data)
        return Applied((view[:first], new, view[end:]), 1, first, len(data) - end)
    count = data.count(old)
    if count > 1 and not edit.replace_all:
        lines = match_lines(data, old, MAX_LINES_LISTED)
        shown = ", ".join(map(str, lines)) + (", ..." if count > len(lines) else "")
        raise ToolFailure(
            f"Error: {path}: old_string occurs {count} times (at lines {shown}); "
            "add surrounding lines to make it unique, or set replace_all"
        )
    return Applied.of(data, data.replace(old, new), count)


def _encoded(text: str, name: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:  # a lone surrogate from a JSON "\ud800" escape
        raise ToolFailure(f"Error: {name} is not valid Unicode text ({exc.reason})") from exc


def match_lines(data: bytes, needle: bytes, limit: int) -> list[int]:
    """The 1-based line numbers where the first `limit` occurrences of `needle` start."""
    lines: list[int] = []
    line, scanned, pos = 1, 0, data.find(needle)
    while pos >= 0 and len(lines) < limit:
        line += data.count(b"\n", scanned, pos)
        scanned = pos
        lines.append(line)
        pos = data.find(needle, pos + len(needle))
    return lines


# --- the no-match diagnostic ---------------------------------------------------------------------------------------

LineNormal = Callable[[str], str]
_NORMALS: tuple[LineNormal, ...] = (
    lambda line: line.rstrip("\r"),
    lambda line: line.rstrip(),
    lambda line: line.strip(),
    lambda line: " ".join(line.split()),
    lambda line: " ".join(line.split()).casefold(),
)


def no_match_message(text: str, old: str, path: str) -> str:
    head = f"Error: {path}: old_string not found"
    near = near_miss(text.split("\n"), old.split("\n"))
    if near is None:
        return head + "; no similar region either (check the path, or read the file again)"
    return head + near


def near_miss(file_lines: list[str], old_lines: list[str], label: str = "old_string") -> str | None:
    """The sentence naming the region of the file most like `old_lines` and how it differs (". The closest region
    is lines 12-14; it differs in: ..."), and the character diff of the two, the legend calling `old_lines` `label`;
    None when nothing in the file is alike. apply_patch's hunks use it too."""
    start = closest_region(file_lines, old_lines)
    if start is None:
        return None
    region = file_lines[start : start + len(old_lines)]
    kinds = difference_kinds(region, old_lines)
    first, last = start + 1, start + len(region)
    named = f"; it differs in: {', '.join(kinds)}" if kinds else ""
    lines = f"line {first}" if first == last else f"lines {first}-{last}"
    diff = char_diff(region[:MAX_DIAGNOSTIC_LINES], old_lines[:MAX_DIAGNOSTIC_LINES], label)
    return f". The closest region is {lines}{named}\n{diff}"


def closest_region(file_lines: list[str], old_lines: list[str]) -> int | None:
    """The 0-based line where the region most like `old_lines` starts, or None when nothing is alike."""
    for normal in _NORMALS:
        found = _normalized_find(file_lines, old_lines, normal)
        if found is not None:
            return found
    return _similar_scan(file_lines, old_lines)


def _normalized_find(file_lines: list[str], old_lines: list[str], normal: LineNormal) -> int | None:
    needle = "\n".join(map(normal, old_lines))
    if not needle.strip():
        return None
    haystack = "\n".join(map(normal, file_lines))
    pos = haystack.find(needle)
    return None if pos < 0 else haystack.count("\n", 0, pos)


def _similar_scan(file_lines: list[str], old_lines: list[str]) -> int | None:
    """The region around the file line most like old_string's longest line (SequenceMatcher, bounded)."""
    stripped = [line.strip() for line in old_lines]
    key = max(range(len(stripped)), key=lambda index: len(stripped[index]))
    if not stripped[key]:
        return None
    matcher = difflib.SequenceMatcher(autojunk=False)
    matcher.set_seq2(stripped[key])
    best, best_score = None, 0.6  # below this, a "closest" region would be noise
    for number, line in enumerate(file_lines[:FUZZY_SCAN_LINES]):
        matcher.set_seq1(line.strip())
        if matcher.real_quick_ratio() > best_score and matcher.quick_ratio() > best_score:
            score = matcher.ratio()
            if score > best_score:
                best, best_score = number, score
    return None if best is None else max(best - key, 0)


def difference_kinds(region: list[str], old_lines: list[str]) -> list[str]:
    """What kind of difference separates the file's lines from old_string's, in words."""
    kinds: list[str] = []

    def add(kind: str) -> None:
        if kind not in kinds:
            kinds.append(kind)

    if len(region) != len(old_lines):
        add("a different number of lines")
    for have, want in zip(region, old_lines, strict=False):
        if have.endswith("\r") != want.endswith("\r"):
            add("line endings: the file has CRLF" if have.endswith("\r") else "line endings: the file has LF")
        have, want = have.rstrip("\r"), want.rstrip("\r")
        if have == want:
            continue
        if have.rstrip() != have or want.rstrip() != want:
            if have.rstrip() == want.rstrip() or have.rstrip() != have and want.rstrip() == want:
                add("trailing whitespace")
        lead_have, lead_want = _indent(have), _indent(want)
        if lead_have != lead_want:
            tabs = ("\t" in lead_have) != ("\t" in lead_want)
            add("indentation: tabs vs spaces" if tabs else "indentation")
        have_words, want_words = " ".join(have.split()), " ".join(want.split())
        if have_words == want_words:
            if have.strip() != want.strip():
                add("whitespace inside the line")
        elif have_words.casefold() == want_words.casefold():
            add("letter case")
        else:
            add("other characters")
    return kinds


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip())]


def _visible(line: str) -> str:
    """A line with tabs, carriage returns and trailing spaces shown, so the character diff can point at them."""
    body = line.rstrip("\r")
    cr = "\\r" if line.endswith("\r") else ""
    core = body.rstrip(" ")
    return core.replace("\t", "\\t") + "\u00b7" * (len(body) - len(core)) + cr


def char_diff(region: list[str], old_lines: list[str], label: str = "old_string") -> str:
    """difflib.ndiff of the file's lines (`-`) against `old_lines` (`+`, the legend names them `label`), `?` lines
    marking the characters."""
    shown = difflib.ndiff([_visible(line) + "\n" for line in region], [_visible(line) + "\n" for line in old_lines])
    legend = f"(- the file, + {label}; \\t is a tab, \\r a carriage return, \u00b7 a trailing space)\n"
    return legend + "".join(shown).rstrip("\n")


# --- the diff of a change --------------------------------------------------------------------------------------------

_HUNK = re.compile(r"^@@ -(\d+)((?:,\d+)?) \+(\d+)((?:,\d+)?) @@")


def unified_diff(before: bytes, after: Applied, path: str) -> str:
    """difflib.unified_diff of the change (a=path, b=path, 3 lines of context), computed over the changed lines only.

    Both sides are UTF-8 and share a head and a tail (`after.head`, `after.tail`); only the lines between, and a few
    of context around them, are decoded, split and compared, so a one-line edit of a 10 MB file costs a few
    scans of it, not a line list of it.
    """
    head, tail = after.head, after.tail
    start = before.rfind(b"\n", 0, head) + 1
    for _ in range(CONTEXT):  # whole lines of context before the change (difflib keeps CONTEXT of whatever it gets)
        if start == 0:
            break
        start = before.rfind(b"\n", 0, start - 1) + 1
    end = len(before) - tail
    for _ in range(CONTEXT + 1):  # to the end of the changed line, then CONTEXT lines more
        found = before.find(b"\n", end)
        end = len(before) if found < 0 else found + 1
    after_end = end - len(before) + after.size  # the tail is the same in both
    a, b = _lines(before[start:end].decode("utf-8")), _lines(after.slice(start, after_end).decode("utf-8"))
    lines = difflib.unified_diff(a, b, fromfile=path, tofile=path, n=CONTEXT)
    return "".join(_shifted(lines, before.count(b"\n", 0, start)))


def _lines(text: str) -> list[str]:
    """The lines of `text`, each with its "\n" (str.splitlines would also split at \x0c, \u2028 and others)."""
    parts = text.split("\n")
    return [part + "\n" for part in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


def _common_prefix(a: bytes, b: bytes) -> int:
    """How many bytes `a` and `b` share at the start, compared a block at a time (slices compare in C)."""
    limit, done = min(len(a), len(b)), 0
    while done < limit:
        step = min(BLOCK, limit - done)
        if a[done : done + step] != b[done : done + step]:
            return done + _first_difference(a[done : done + step], b[done : done + step])
        done += step
    return done


def _common_suffix(a: bytes, b: bytes, limit: int) -> int:
    """How many bytes `a` and `b` share at the end, at most `limit` (so it never overlaps the prefix)."""
    done = 0
    while done < limit:
        step = min(BLOCK, limit - done)
        tail_a, tail_b = a[len(a) - done - step : len(a) - done], b[len(b) - done - step : len(b) - done]
        if tail_a != tail_b:
            return done + _first_difference(tail_a[::-1], tail_b[::-1])
        done += step
    return done


def _first_difference(a: bytes, b: bytes) -> int:
    """The index of the first character where `a` and `b` (of one length, and different) differ: a binary search."""
    low, high = 0, len(a)
    while low < high:
        middle = (low + high) // 2
        if a[: middle + 1] == b[: middle + 1]:
            low = middle + 1
        else:
            high = middle
    return low


def _shifted(lines: Iterable[str], offset: int) -> Iterable[str]:
    for line in lines:
        if not line.endswith("\n"):
            line += "\n\\ No newline at end of file\n"
        match = _HUNK.match(line) if offset else None
        if match:
            old_start, new_start = int(match.group(1)) + offset, int(match.group(3)) + offset
            line = f"@@ -{old_start}{match.group(2)} +{new_start}{match.group(4)} @@" + line[match.end() :]
        yield line
