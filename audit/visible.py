"""Characters that change how text looks without being seen, made visible for the people who review it.

An agent chooses the text of its arguments, a repository the output of its commands, a client the name it
registers under. Shown raw, a terminal escape (ESC, CR) rewrites what an operator's terminal shows of an export, and
a bidirectional override (U+202E) makes `txt.exe` of `exe.txt` on an admin page. Every such character is shown
instead as its code point between double angle brackets (`⟪U+202E⟫`), a spelling that needs no escaping in HTML
text, an HTML attribute, a script block or a CSV cell. Newline and tab stay as they are: they lay out text and
hide nothing; so does carriage return before a newline in HTML, where a form sends every line break of a text
area back as CRLF. The stored records keep the exact text; their SHA-256 and the JSON Lines export (which escapes these
characters as `\\uXXXX`, losing nothing) are the way to the original bytes.
"""

from __future__ import annotations

import re

# C0 controls but tab, newline and carriage return, DEL and the C1 controls; the bidirectional marks, embeddings, overrides and
# isolates (Unicode's Bidi_Control property).
_CONTROLS = "\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f"
_BIDI = "\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
HIDDEN = re.compile(f"[{_CONTROLS}\r{_BIDI}]")
HIDDEN_IN_HTML = re.compile(f"[{_CONTROLS}{_BIDI}]|\r(?!\n)")
# What JSON leaves raw with ensure_ascii=False (it escapes the C0 controls itself).
_JSON_RAW = re.compile(f"[\x7f-\x9f{_BIDI}]")


def _spelled(match: re.Match[str]) -> str:
    return f"⟪U+{ord(match.group()):04X}⟫"


def make_visible(text: str) -> str:
    """`text` with each control and bidirectional character spelled out as `⟪U+XXXX⟫` (for CSV and terminals)."""
    return HIDDEN.sub(_spelled, text)


def make_visible_in_html(html: str) -> str:
    """make_visible for an HTML document, which keeps its CRLF line breaks."""
    return HIDDEN_IN_HTML.sub(_spelled, html)


def escape_json_text(text: str) -> str:
    """JSON text with the DEL, C1 and bidirectional characters written as `\\uXXXX` escapes: the same JSON value."""
    return _JSON_RAW.sub(lambda match: f"\\u{ord(match.group()):04x}", text)
