"""Client ID metadata documents (CIMD): a client names itself by an https URL, which this server fetches.

The toolkit fetches (SSRF-hardened: https only, public addresses only, no redirects, bounded) and, when that fails,
treats the client as unknown: the browser gets "Invalid client_id parameter value." and the cause goes to an INFO
log line. `ExplainingMetadataFetcher` (the CIMD_METADATA_FETCHER setting, the toolkit's documented hook) keeps the
cause for the consent view's error page, which says what failed and what to do. SANDSTORM_CLIENT_METADATA_DOCUMENTS
off turns the documents off (CIMD_ENABLED): clients then register dynamically.
"""

from __future__ import annotations

import hashlib
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core.cache import cache
from oauth2_provider.cimd import CIMDError, SafeMetadataFetcher, is_cimd_client_id
from oauth2_provider.settings import oauth2_settings

CACHE_PREFIX = "sandstorm:cimd:failure:"
# Kept a little longer than the toolkit's failure backoff, during which it does not fetch again (and so could not
# tell us again why).
KEEP_EXTRA_SECONDS = 60
SETTING = "SANDSTORM_CLIENT_METADATA_DOCUMENTS"


def _key(client_id: str) -> str:
    return CACHE_PREFIX + hashlib.sha256(client_id.encode("utf-8")).hexdigest()


def remember_failure(client_id: str, reason: str) -> None:
    seconds = int(oauth2_settings.CIMD_FAILURE_BACKOFF_SECONDS or 0) + KEEP_EXTRA_SECONDS
    cache.set(_key(client_id), reason[:500], seconds)


def failure_of(client_id: str) -> str | None:
    """Why the last fetch of `client_id`'s document failed, if it did lately (in this server process)."""
    reason = cache.get(_key(client_id))
    return reason if isinstance(reason, str) else None


class ExplainingMetadataFetcher:
    """The toolkit's fetcher (`base`), remembering why a fetch failed. Also checks what the toolkit checks first
    after the fetch (the document's own client_id), so that the commonest refusal of a fetched document is
    explained too."""

    base: type[Any] = SafeMetadataFetcher

    def fetch(self, client_id: str) -> tuple[dict[str, Any], int]:
        try:
            metadata, max_age = self.base().fetch(client_id)
        except CIMDError as error:
            remember_failure(client_id, str(error))
            raise
        if metadata.get("client_id") != client_id:
            reason = "the document's client_id is not the URL it was fetched from"
            remember_failure(client_id, reason)
            raise CIMDError(reason)
        return metadata, max_age


def _kind_of(reason: str) -> str:
    """The toolkit's reason (oauth2_provider.cimd CIMDError messages, urllib3's for the connection) in a word."""
    lowered = reason.lower()
    if "non-public address" in lowered:
        return "private"
    if "could not resolve" in lowered or "did not resolve" in lowered:
        return "dns"
    if "timed out" in lowered or "timeout" in lowered:
        return "timeout"
    if "returned http" in lowered:
        return "http"
    if "could not fetch" in lowered:
        return "connection"
    return "document"


HEADLINES = {
    "private": "its host resolves to a private or loopback address, which this server never fetches from",
    "dns": "its host name could not be resolved (DNS)",
    "timeout": "the connection timed out",
    "http": "the server there did not return the document",
    "connection": "no HTTPS connection could be made",
}
FALL_BACK = (
    f"Or set {SETTING}=0 in the server's environment and restart it: the server then stops offering metadata "
    "documents and clients register dynamically instead (remove and add the server in the client, then sign in "
    "again)."
)


def unknown_client_explanation(client_id: str) -> dict[str, Any] | None:
    """For the error page of an authorization request with an unknown client: why, when the client_id is a URL."""
    if not is_cimd_client_id(client_id):
        return None
    url = client_id[:255]
    host = urlsplit(url).hostname or url
    if not oauth2_settings.CIMD_ENABLED:
        return {
            "what_failed": (
                f"This application identifies itself by the URL {url} (a client ID metadata document), and this "
                f"server does not accept those ({SETTING} is off)."
            ),
            "reason": "",
            "what_to_do": [
                "The application must register dynamically: remove this server in the application and add it again, "
                f"then sign in again; it registers at {settings.PUBLIC_URL}/oauth/register/ when the server does "
                "not offer metadata documents.",
                f"Or, if this server can make outbound HTTPS connections, turn {SETTING} back on.",
            ],
        }
    reason = failure_of(url)
    if reason is None:
        return {
            "what_failed": f"The application's metadata document {url} could not be fetched or was refused.",
            "reason": "The server's log has the cause (an INFO line from oauth2_provider.cimd).",
            "what_to_do": [
                f"Check that this server can make outbound HTTPS connections to {host}, then try again in a minute.",
                FALL_BACK,
            ],
        }
    kind = _kind_of(reason)
    if kind == "private":
        steps = [
            "Metadata documents are fetched only from public addresses (a request for a private one could reach "
            "services inside your network). Use an application whose document is on a public HTTPS host.",
            FALL_BACK,
        ]
    elif kind == "document":
        steps = ["The application's document is at fault: report it to the application's authors.", FALL_BACK]
        return {
            "what_failed": f"Fetched {url}, but it is not a valid client metadata document.",
            "reason": f"Cause: {reason}",
            "what_to_do": steps,
        }
    else:
        steps = [
            f"Allow outbound HTTPS (port 443) from this server to {host}: Claude Code's and Claude.ai's sign-in "
            "need it. Then try again in a minute (failed fetches are not retried sooner).",
            FALL_BACK,
        ]
    return {
        "what_failed": f"Could not fetch {url}: {HEADLINES[kind]}.",
        "reason": f"Cause: {reason}",
        "what_to_do": steps,
    }
