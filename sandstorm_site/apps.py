"""The admin app with this project's site class (Django's `default_site` hook): sandstorm_site.admin_site."""

from __future__ import annotations

from django.contrib.admin.apps import AdminConfig


class SandstormAdminConfig(AdminConfig):
    """Replaces "django.contrib.admin" in INSTALLED_APPS: `admin.site` is a SandstormAdminSite."""

    default_site = "sandstorm_site.admin_site.SandstormAdminSite"
