"""Values as every database stores them and gives them back, so a record's mac holds on SQLite and PostgreSQL alike.

The mac is computed over a record before it is saved and checked later over what the database returns, so the two
must be the same. PostgreSQL's text and jsonb cannot hold the NUL character (the insert fails), and jsonb keeps
numbers as decimals: the float 1e+20 comes back as the integer 100000000000000000000, -0.0 as 0.0, and NaN or
Infinity are refused. An agent chooses much of what is recorded (arguments, command output), so each of these
would let it break the audit log on PostgreSQL: a call that cannot be recorded, or a record that no longer
verifies. They are stored the same way on both databases instead.
"""

from __future__ import annotations

import math
from typing import Any

NUL = "\x00"
NUL_STAND_IN = "\ufffd"  # the replacement character, as undecodable output already shows
# From here on a float's repr has an exponent, and every float this large is a whole number.
EXPONENT_FROM = 1e16


def storable_text(value: str) -> str:
    return value.replace(NUL, NUL_STAND_IN) if NUL in value else value


def storable_json(value: Any) -> Any:
    """`value` (JSON-like) with NULs in strings and keys replaced and floats in a form every database keeps."""
    if isinstance(value, str):
        return storable_text(value)
    if isinstance(value, float):
        return _storable_float(value)
    if isinstance(value, dict):
        return {storable_text(key) if isinstance(key, str) else key: storable_json(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [storable_json(item) for item in value]
    return value


def _storable_float(value: float) -> float | int | str:
    if not math.isfinite(value):
        return repr(value)  # 'nan', 'inf', '-inf': JSON has no such numbers
    if abs(value) >= EXPONENT_FROM:
        return int(value)
    return value + 0.0  # -0.0 becomes 0.0
