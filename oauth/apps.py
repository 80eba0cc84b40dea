from django.apps import AppConfig
from django.urls import reverse


def bearer_token_page(credential_id: str) -> str | None:
    """The admin page of a bearer token (where it is revoked), for the audit log's call pages."""
    return reverse("admin:oauth_bearertoken_change", args=[credential_id]) if credential_id.isdigit() else None


class OAuthConfig(AppConfig):
    name = "oauth"
    verbose_name = "Credentials"

    def ready(self) -> None:
        from audit.credential_links import register_credential_link
        from oauth import throttle  # noqa: F401  (counts failed admin logins)
        from oauth.credentials import KIND_BEARER

        register_credential_link(KIND_BEARER, bearer_token_page)
