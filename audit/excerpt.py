"""Large values are kept as head and tail, with the full size and a SHA-256 of the whole."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from audit.redaction import redact, redact_text


@dataclass(frozen=True)
class Excerpt:
    text: str
    size: int
    sha256: str
    cut: bool


def excerpt(text: str, limit: int) -> Excerpt:
    """The first and last `limit` bytes of `text` (redacted), its full size and SHA-256 (of the original)."""
    data = text.encode("utf-8", errors="surrogatepass")
    digest = hashlib.sha256(data).hexdigest()
    if len(data) <= 2 * limit:
        return Excerpt(redact_text(text), len(data), digest, False)
    head = data[:limit].decode("utf-8", errors="ignore")
    tail = data[-limit:].decode("utf-8", errors="ignore")
    marker = f"\n[... {len(data) - 2 * limit} bytes not kept; sha256 of the whole: {digest} ...]\n"
    return Excerpt(redact_text(head) + marker + redact_text(tail), len(data), digest, True)


@dataclass(frozen=True)
class StoredArguments:
    arguments: dict[str, Any]
    size: int
    sha256: str
    large: dict[str, dict[str, Any]]


def store_arguments(arguments: dict[str, Any], limit: int) -> StoredArguments:
    """Arguments as stored: secrets redacted, long strings cut; size and hash are of the original arguments."""
    whole = json.dumps(arguments, sort_keys=True, ensure_ascii=False, default=str).encode("utf-8", errors="surrogatepass")
    stored: dict[str, Any] = {}
    large: dict[str, dict[str, Any]] = {}
    for name, value in arguments.items():
        if isinstance(value, str) and len(value) > limit:
            cut = excerpt(value, limit)
            stored[name] = cut.text
            if cut.cut:
                large[name] = {"size": cut.size, "sha256": cut.sha256}
        else:
            stored[name] = redact({name: value})[name]
    return StoredArguments(stored, len(whole), hashlib.sha256(whole).hexdigest(), large)
