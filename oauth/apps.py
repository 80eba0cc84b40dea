from django.apps import AppConfig


class OAuthConfig(AppConfig):
    name = "oauth"
    verbose_name = "Credentials"
