"""Where the audit log's call pages link a credential to: its page in the console and its revoke confirmation
(registered with audit.credential_links by oauth.apps).

A bearer token's audit credential id is its primary key. An OAuth call's is the id of the access token it used,
which a refresh or a revocation deletes; the client is then found by the label the audit log recorded with the call
(oauth.credentials.application_label, which ends with the client id), checked against the client's own label.
"""

from __future__ import annotations

from django.urls import reverse
from oauth2_provider.models import AccessToken, Application

from audit.models import KIND_STARTED, AuditRecord
from oauth.credentials import KIND_OAUTH, application_label

LABEL_CLIENT = " (client "


def bearer_token_page(credential_id: str) -> str | None:
    return reverse("admin:oauth_bearertoken_change", args=[credential_id]) if credential_id.isdigit() else None


def bearer_token_revoke_page(credential_id: str) -> str | None:
    return reverse("admin:oauth_bearertoken_revoke", args=[credential_id]) if credential_id.isdigit() else None


def application_of(credential_id: str) -> Application | None:
    """The OAuth client whose access token `credential_id` made a call."""
    if not credential_id.isdigit():
        return None
    token = AccessToken.objects.filter(pk=int(credential_id)).select_related("application").first()
    if token is not None and token.application is not None:
        return token.application
    label = (
        AuditRecord.objects.filter(kind=KIND_STARTED, credential_kind=KIND_OAUTH, credential_id=credential_id)
        .order_by("-id")
        .values_list("credential_name", flat=True)
        .first()
    )
    if not label or not label.endswith(")") or LABEL_CLIENT not in label:
        return None
    client_id = label.rsplit(LABEL_CLIENT, 1)[1][:-1]
    application = Application.objects.filter(client_id=client_id).first()
    if application is None or application_label(application.name, application.client_id) != label:
        return None
    return application


def app_page(credential_id: str) -> str | None:
    application = application_of(credential_id)
    return reverse("admin:oauth_connectedapp_change", args=[application.pk]) if application else None


def app_revoke_page(credential_id: str) -> str | None:
    application = application_of(credential_id)
    return reverse("admin:oauth_connectedapp_revoke", args=[application.pk]) if application else None
