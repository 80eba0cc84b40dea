"""Where the audit admin links a call's credential to: the app that owns a kind of credential registers how.

audit sits below the apps whose credentials it records and knows none of their admin pages; oauth registers its
credentials' pages and revoke confirmations at start-up (oauth.apps).
"""

from __future__ import annotations

from collections.abc import Callable

# credential id (as the audit record holds it) -> the URL of the credential's page, or None if it has none
CredentialLink = Callable[[str], str | None]

_links: dict[str, CredentialLink] = {}
_revoke_links: dict[str, CredentialLink] = {}


def register_credential_link(kind: str, link: CredentialLink, *, revoke: CredentialLink | None = None) -> None:
    """How a credential of `kind` ("bearer", "oauth") links to its page, and to the page that confirms its
    revocation; a later registration replaces it."""
    _links[kind] = link
    if revoke is not None:
        _revoke_links[kind] = revoke
    else:
        _revoke_links.pop(kind, None)


def credential_link(kind: str, credential_id: str) -> str | None:
    """The page of the credential, or None if its kind registered none or it has no page."""
    link = _links.get(kind)
    return link(credential_id) if link is not None else None


def revoke_link(kind: str, credential_id: str) -> str | None:
    """The page that confirms revoking the credential, or None if its kind registered none."""
    link = _revoke_links.get(kind)
    return link(credential_id) if link is not None else None
