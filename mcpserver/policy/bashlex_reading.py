"""bashlex's reading of one shell text, for shell.py's walk: here-documents taken out first, a budget of words and
operators, and the `time` keyword that bashlex 0.18 does not implement.

Cost: bashlex takes 40 to 60 µs a word or operator and reads a command substitution again, so a text is counted
(`_tokens`) before bashlex sees it, and refused past the budget the caller has left of MAX_TOKENS.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass
from typing import Any

import bashlex
import bashlex.ast
import bashlex.errors

MAX_TOKENS = 1_500  # words and operators bashlex may read for one command, scripts inside it included (~0.1 s)

_HEREDOC = re.compile(
    r"(?<!<)<<(?!<)(?P<dash>-?)[ \t]*(?:'(?P<single>[\w.-]+)'|\"(?P<double>[\w.-]+)\"|\\(?P<escaped>[\w.-]+)|(?P<bare>[\w.-]+))"
    r"(?=[\s;&|<>()]|$)",
    re.ASCII,
)
_TIME_KEYWORD = re.compile(r"(?:^|(?<=[\s;&|(!{]))time(?=\s)")


@dataclass(frozen=True)
class Body:
    """A here-document's body as the prescan found it in the original text."""

    text: str
    literal: bool  # its delimiter was quoted: nothing in it is expanded


@dataclass(frozen=True)
class Reading:
    trees: list[Any]
    source: str  # the text bashlex read
    bodies: dict[int, Body]  # here-document bodies by their offset in the original text
    inserted: tuple[int, ...] = ()  # offsets in `source` of characters the parse added (`\time`)

    def original(self, position: int) -> int:
        """The offset in the original text of `position` in `source`."""
        return position - bisect.bisect_left(self.inserted, position)


def _prescan(text: str) -> tuple[str, str, dict[int, Body]]:
    """Find the here-documents of `text`: (the text with their delimiters' quotes blanked, the same with their
    bodies blanked too, the bodies by offset). Both rewrites keep every offset.

    bashlex 0.18 cannot match a quoted delimiter (`<<'EOF'`), and reads substitutions in the body of a quoted
    here-document inside `$( )` (Claude Code's `git commit -m "$(cat <<'EOF' … EOF )"`): a backquote in a commit
    message became a command, or a parse error. Bodies are taken from here instead, and blanked for bashlex. This
    scan does not know quoting, so a `<<` it finds inside quotes is only a guess: the parse is used only if bashlex
    finds a here-document at each body found here (`_verified`), else the text is read again with bodies kept.
    """
    unquoted, blanked = list(text), list(text)
    bodies: dict[int, Body] = {}
    regions: list[tuple[int, int]] = []
    next_start = 0
    for match in _HEREDOC.finditer(text):
        if any(start <= match.start() < end for start, end in regions):
            continue  # inside an earlier body: text, not an operator
        line_end = text.find("\n", match.end())
        if line_end < 0:
            break
        name = match.group("single") or match.group("double") or match.group("escaped") or match.group("bare")
        tabs = "\t*" if match.group("dash") else ""
        start = max(line_end + 1, next_start)  # several here-documents on a line follow one another
        terminator = re.compile(rf"^{tabs}{re.escape(name)}$", re.MULTILINE).search(text, start)
        if terminator is None:
            break
        for at in range(match.start(), match.end()):
            if text[at] in "'\"\\" and at > match.start() + 1:
                unquoted[at] = blanked[at] = " "
        for at in range(start, terminator.start()):
            if text[at] != "\n":
                blanked[at] = " "
        bodies[start] = Body(text[start : terminator.start()], not match.group("bare"))
        regions.append((start, terminator.end()))
        next_start = terminator.end() + 1
    return "".join(unquoted), "".join(blanked), bodies


def read_with_bashlex(text: str, budget: int) -> tuple[Reading | str, int]:
    """bashlex's reading of `text`, or why there is none; and the tokens it cost, refused past `budget`."""
    unquoted, blanked, bodies = _prescan(text)
    cost = 0
    try:
        if bodies:
            cost = _tokens(blanked)
            if cost > budget:
                return _TOO_LONG, 0
            reading = _bashlex(blanked, bodies)
            if _verified(reading):
                return reading, cost
        cost += _tokens(unquoted)
        if cost > budget:
            return _TOO_LONG, 0
        return _bashlex(unquoted, bodies), cost
    except bashlex.errors.ParsingError as error:
        return f"the shell cannot parse it ({error.message})", cost
    except NotImplementedError as error:
        return f"it uses shell syntax the parser does not read ({str(error)[:80]})", cost
    except Exception as error:  # noqa: BLE001 - bashlex fails with IndexError, AttributeError, RecursionError… on odd text
        return f"the shell parser could not read it ({type(error).__name__})", cost


_TOO_LONG = f"the command has more than {MAX_TOKENS} words and operators to read"
# What bashlex's cost grows with: words and operators (a quoted string is one, however long), and substitutions,
# which it reads again (one costs about as much as five words).
_TOKEN = re.compile(r"""'[^']*'|"(?:[^"\\]|\\.)*"|[^\s;&|<>()'"]+|\S""")
_SUBSTITUTION_COST = 4


def _tokens(text: str) -> int:
    substitutions = text.count("$(") + text.count("`") // 2 + text.count("<(") + text.count(">(")
    return sum(1 for _ in _TOKEN.finditer(text)) + _SUBSTITUTION_COST * substitutions


def _bashlex(source: str, bodies: dict[int, Body]) -> Reading:
    """bashlex's trees; for the `time` keyword, which bashlex 0.18 does not implement, read again with it quoted
    (`\\time`): the `time` command, which wrappers.py sees through."""
    try:
        return Reading(bashlex.parse(source), source, bodies)
    except NotImplementedError as error:
        if "time" not in str(error):
            raise
    inserted: list[int] = []

    def quote(match: re.Match[str]) -> str:
        inserted.append(match.start() + len(inserted))
        return "\\time"

    source = _TIME_KEYWORD.sub(quote, source)
    return Reading(bashlex.parse(source), source, bodies, tuple(inserted))


def _verified(reading: Reading) -> bool:
    """Whether bashlex found a here-document at each body the prescan blanked, and no other."""
    found: set[int] = set()
    pending = list(reading.trees)
    while pending:
        node = pending.pop()
        if node.kind == "heredoc":
            found.add(reading.original(node.pos[0]))
        for value in vars(node).values():
            pending.extend(child for child in (value if isinstance(value, list) else [value]) if _is_node(child))
    return found == set(reading.bodies)


def _is_node(value: object) -> bool:
    return isinstance(value, bashlex.ast.node)
