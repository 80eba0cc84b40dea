"""The admin app with this project's site class (Django's `default_site` hook): sandstorm_site.admin_site."""

from __future__ import annotations

from django.contrib import admin
from django.contrib.admin.apps import AdminConfig


class SandstormAdminConfig(AdminConfig):
    """Replaces "django.contrib.admin" in INSTALLED_APPS: `admin.site` is a SandstormAdminSite."""

    default_site = "sandstorm_site.admin_site.SandstormAdminSite"

    def ready(self) -> None:
        super().ready()  # autodiscovery: every app's admin module, django.contrib.auth's among them
        from sandstorm_site import admin_accounts  # models are not ready when this module is imported

        admin_accounts.register(admin.site)
