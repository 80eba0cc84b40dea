"""Large values are kept as head and tail, with the full size and a SHA-256 of the whole."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from audit.redaction import redact_counted, redact_text_counted


@dataclass(frozen=True)
class Excerpt:
    text: str
    size: int
    sha256: str
    cut: bool
    masked: int = 0  # spans redaction masked in `text`


def excerpt(text: str, limit: int) -> Excerpt:
    """The first and last `limit` bytes of `text` (redacted), its full size and SHA-256 (of the original)."""
    data = text.encode("utf-8", errors="surrogatepass")
    digest = hashlib.sha256(data).hexdigest()
    if len(data) <= 2 * limit:
        whole = redact_text_counted(text)
        return Excerpt(whole.value, len(data), digest, False, whole.masked)
    head = redact_text_counted(data[:limit].decode("utf-8", errors="ignore"))
    tail = redact_text_counted(data[-limit:].decode("utf-8", errors="ignore"), parse=False)  # starts mid-text
    marker = f"\n[... {len(data) - 2 * limit} bytes not kept; sha256 of the whole: {digest} ...]\n"
    return Excerpt(head.value + marker + tail.value, len(data), digest, True, head.masked + tail.masked)


@dataclass(frozen=True)
class StoredArguments:
    arguments: dict[str, Any]
    size: int
    sha256: str
    large: dict[str, dict[str, Any]]
    redacted: list[str]  # the arguments in which redaction masked something


def store_arguments(arguments: dict[str, Any], limit: int) -> StoredArguments:
    """Arguments as stored: secrets redacted, long strings cut; size and hash are of the original arguments."""
    whole = json.dumps(arguments, sort_keys=True, ensure_ascii=False, default=str).encode(
        "utf-8", errors="surrogatepass"
    )
    stored: dict[str, Any] = {}
    large: dict[str, dict[str, Any]] = {}
    redacted: list[str] = []
    for name, value in arguments.items():
        if isinstance(value, str) and len(value) > limit:
            cut = excerpt(value, limit)
            stored[name], masked = cut.text, cut.masked
            if cut.cut:
                large[name] = {"size": cut.size, "sha256": cut.sha256}
        else:
            kept = redact_counted({name: value})
            stored[name], masked = kept.value[name], kept.masked
        if masked:
            redacted.append(name)
    return StoredArguments(stored, len(whole), hashlib.sha256(whole).hexdigest(), large, redacted)
