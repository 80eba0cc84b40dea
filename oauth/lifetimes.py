"""How long OAuth access lasts, in words, from the toolkit's settings (the consent card and the console say it)."""

from __future__ import annotations

from datetime import timedelta

from oauth2_provider.settings import oauth2_settings

UNITS = ((86400, "day"), (3600, "hour"), (60, "minute"), (1, "second"))


def in_words(seconds: int | float | timedelta) -> str:
    """A duration in its largest whole unit: 3600 -> "1 hour", 2592000 -> "30 days", 5400 -> "90 minutes"."""
    total = int(seconds.total_seconds() if isinstance(seconds, timedelta) else seconds)
    for size, unit in UNITS:
        if total >= size and total % size == 0:
            count = total // size
            return f"{count} {unit}{'' if count == 1 else 's'}"
    return f"{total} seconds"


def access_token_seconds() -> int:
    return int(oauth2_settings.ACCESS_TOKEN_EXPIRE_SECONDS)


def refresh_token_seconds() -> int | None:
    """The refresh token's idle lifetime (None: it never lapses). The toolkit counts it from the expiry of the
    access token issued with it, and every refresh issues a new pair, so a client that comes back in time keeps
    access until it is revoked."""
    value = oauth2_settings.REFRESH_TOKEN_EXPIRE_SECONDS
    if not value:
        return None
    return int(value.total_seconds() if isinstance(value, timedelta) else value)


def access_duration_text() -> str:
    """One sentence for the consent card."""
    access = in_words(access_token_seconds())
    idle = refresh_token_seconds()
    if idle is None:
        return f"Access lasts {access} at a time and the app renews it by itself, until you revoke it."
    return (
        f"Access lasts {access} at a time and the app renews it by itself; it ends after {in_words(idle)} without "
        "use, or when you revoke it."
    )
