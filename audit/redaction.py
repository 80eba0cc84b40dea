"""Secrets an agent passes in arguments are redacted before anything is stored (hashes are taken over originals)."""

from __future__ import annotations

import re
from typing import Any

MASK = "[REDACTED]"
SECRET_NAME = r"[A-Za-z0-9_]*(?:TOKEN|SECRET|PASSWORD|PASSWD|PASSPHRASE|API_?KEY|ACCESS_?KEY|PRIVATE_?KEY|CREDENTIALS?)[A-Za-z0-9_]*"

_PATTERNS: list[tuple[re.Pattern[str], str]] = [
    # user:password@ (or a token as the user) in URLs
    (re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*://)[^/\s@:]+(?::[^/\s@]*)?@"), rf"\1{MASK}@"),
    # Authorization headers, whatever the scheme
    (re.compile(r"(?i)(\bauthorization\s*[:=]\s*)((?:bearer|basic|token|digest)\s+)?[^\s'\"]+"), rf"\1\2{MASK}"),
    # bearer-looking tokens anywhere
    (re.compile(r"(?i)\b(bearer\s+)[A-Za-z0-9._~+/=\-]{8,}"), rf"\1{MASK}"),
    # well-known token formats
    (re.compile(r"\b(sst_|ghp_|gho_|ghu_|ghs_|github_pat_|glpat-|xox[abpr]-|sk-|npm_)[A-Za-z0-9_\-]{10,}"), rf"\1{MASK}"),
    # NAME=value / NAME: value for variables named like secrets (export FOO_TOKEN=..., "api_key": "...")
    (re.compile(rf"(?i)\b({SECRET_NAME})([\"']?\s*[=:]\s*)(\"[^\"]*\"|'[^']*'|[^\s,;&|]+)"), rf"\1\2{MASK}"),
    # --password=value / --token value
    (re.compile(r"(?i)(--?[a-z0-9\-]*(?:token|secret|password|passwd|api-?key)[a-z0-9\-]*)(=|\s+)(\"[^\"]*\"|'[^']*'|[^\s]+)"), rf"\1\2{MASK}"),
]
_SECRET_KEY = re.compile(rf"(?i)^{SECRET_NAME}$")


def redact_text(text: str) -> str:
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    return text


def redact(value: Any) -> Any:
    """A copy of `value` (JSON-like) with secrets in strings, and values under secret-named keys, masked."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, dict):
        return {key: MASK if _SECRET_KEY.match(str(key)) and value[key] else redact(value[key]) for key in value}
    if isinstance(value, list):
        return [redact(item) for item in value]
    return value
