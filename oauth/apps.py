from django.apps import AppConfig


class OAuthConfig(AppConfig):
    name = "oauth"
    verbose_name = "Credentials"

    def ready(self) -> None:
        from oauth import throttle  # noqa: F401  (counts failed admin logins)
