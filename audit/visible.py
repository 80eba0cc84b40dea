"""Characters that change how text looks without being seen, made visible for the people who review it.

An agent chooses the text of its arguments, a repository the output of its commands, a client the name it
registers under. Shown raw, a terminal escape (ESC, CR) rewrites what an operator's terminal shows of an export, a
bidirectional override (U+202E) makes `txt.exe` of `exe.txt` on an admin page, and a zero-width space (U+200B) makes
two commands look alike. Every such character (the control characters and Unicode's format characters, category Cf)
is shown instead as its code point between double angle brackets (`⟪U+202E⟫`), a spelling that needs no escaping in
HTML text, an HTML attribute, a script block or a CSV cell. Newline and tab stay as they are: they lay out text and
hide nothing; so does carriage return before a newline in HTML, where a form sends every line break of a text area
back as CRLF. The stored records keep the exact text; their SHA-256 and the JSON Lines export (which escapes these
characters as `\\uXXXX`, losing nothing) are the way to the original bytes.

The console's live view spells out the same characters in the browser: `visible()` in
mcpserver/static/mcpserver/console_live.js holds the same two classes.
"""

from __future__ import annotations

import re

# C0 controls but tab, newline and carriage return, DEL and the C1 controls.
_CONTROLS = "\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f"
# Unicode's format characters (Cf, as of Unicode 15.1): soft hyphen, the bidirectional marks, embeddings, overrides
# and isolates, zero-width space and joiners, word joiner and invisible operators, byte order mark, interlinear
# annotation, the tags (U+E0001, U+E0020-E007F) and the script-specific ones. A test checks that this covers every Cf
# character Python's own Unicode database knows.
_FORMAT = (
    "\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u180e\u200b-\u200f\u202a-\u202e\u2060-\u2064"
    "\u2066-\u206f\ufeff\ufff9-\ufffb\U000110bd\U000110cd\U00013430-\U0001343f\U0001bca0-\U0001bca3"
    "\U0001d173-\U0001d17a\U000e0001\U000e0020-\U000e007f"
)
HIDDEN = re.compile(f"[{_CONTROLS}\r{_FORMAT}]")
HIDDEN_IN_HTML = re.compile(f"[{_CONTROLS}{_FORMAT}]|\r(?!\n)")
# What JSON leaves raw with ensure_ascii=False (it escapes the C0 controls itself).
_JSON_RAW = re.compile(f"[\x7f-\x9f{_FORMAT}]")
_WHITESPACE = re.compile(r"\s+")
ELLIPSIS = "…"


def _spelled(match: re.Match[str]) -> str:
    return f"⟪U+{ord(match.group()):04X}⟫"


def make_visible(text: str) -> str:
    """`text` with each control and format character spelled out as `⟪U+XXXX⟫` (for CSV and terminals)."""
    return HIDDEN.sub(_spelled, text)


def make_visible_in_html(html: str) -> str:
    """make_visible for what a browser shows (an HTML page, a command on a card), which keeps its CRLF line breaks."""
    return HIDDEN_IN_HTML.sub(_spelled, html)


def hidden_count(text: str, *, in_html: bool = True) -> int:
    """How many characters make_visible_in_html (or, not `in_html`, make_visible) spells out in `text`: what a card
    or a notification says the command hid."""
    return sum(1 for _ in (HIDDEN_IN_HTML if in_html else HIDDEN).finditer(text))


def one_line(text: str, limit: int) -> str:
    """`text` for a list's cell or a subject: hidden characters spelled out first (so none becomes a plain space),
    then every run of whitespace one space, at most `limit` characters, shortened with "…" never inside a
    `⟪U+XXXX⟫`."""
    line = _WHITESPACE.sub(" ", make_visible_in_html(text)).strip()
    return line if len(line) <= limit else shorten(line, limit)


def shorten(text: str, limit: int) -> str:
    """`text` cut to at most `limit` characters with "…", never inside a spelled-out character."""
    cut = text[: max(limit - 1, 0)]
    opened = cut.rfind("⟪")
    if opened != -1 and "⟫" not in cut[opened:]:
        cut = cut[:opened]
    return cut + ELLIPSIS


def _json_escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    high, low = divmod(code - 0x10000, 0x400)  # JSON writes a character beyond the BMP as a surrogate pair
    return f"\\u{0xD800 + high:04x}\\u{0xDC00 + low:04x}"


def escape_json_text(text: str) -> str:
    """JSON text with the DEL, C1 and format characters written as `\\uXXXX` escapes: the same JSON value."""
    return _JSON_RAW.sub(_json_escape, text)
