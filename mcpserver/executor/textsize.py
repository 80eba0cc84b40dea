"""Sizes of text as it travels: UTF-8 bytes once JSON-escaped, which is what the client's event limit counts."""

from __future__ import annotations

import json


def json_size(text: str) -> int:
    """Bytes `text` takes inside a JSON string (quotes excluded), as the server serializes it."""
    return len(json.dumps(text, ensure_ascii=False).encode("utf-8")) - 2


def cut_to_json_size(text: str, budget: int) -> str:
    """The longest prefix of `text` whose JSON size is at most `budget` bytes."""
    if json_size(text) <= budget:
        return text
    low, high = 0, min(len(text), budget)
    while low < high:  # binary search on characters: escaping makes size per character vary from 1 to 6
        middle = (low + high + 1) // 2
        if json_size(text[:middle]) <= budget:
            low = middle
        else:
            high = middle - 1
    return text[:low]


def cut_suffix_to_json_size(text: str, budget: int) -> str:
    """The longest suffix of `text` whose JSON size is at most `budget` bytes."""
    if json_size(text) <= budget:
        return text
    low, high = 0, min(len(text), budget)
    while low < high:
        middle = (low + high + 1) // 2
        if json_size(text[len(text) - middle :]) <= budget:
            low = middle
        else:
            high = middle - 1
    return text[len(text) - low :] if low else ""
