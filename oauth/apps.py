from django.apps import AppConfig


class OAuthConfig(AppConfig):
    name = "oauth"
    verbose_name = "Credentials"

    def ready(self) -> None:
        from audit.credential_links import register_credential_link
        from oauth import throttle  # noqa: F401  (counts failed admin logins)
        from oauth.credential_pages import app_page, app_revoke_page, bearer_token_page, bearer_token_revoke_page
        from oauth.credentials import KIND_BEARER, KIND_OAUTH

        register_credential_link(KIND_BEARER, bearer_token_page, revoke=bearer_token_revoke_page)
        register_credential_link(KIND_OAUTH, app_page, revoke=app_revoke_page)
