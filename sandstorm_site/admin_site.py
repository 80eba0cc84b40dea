"""The console: Django's admin site, as this project's own class (Django's `default_site` hook), so that sign-in,
the home page and who may enter are decided here rather than by patching the stock site after import."""

from __future__ import annotations

from django.contrib import admin

from oauth.throttle import ThrottledLoginForm


class SandstormAdminSite(admin.AdminSite):
    site_header = "Sandstorm"
    site_title = "Sandstorm admin"
    index_title = "Tokens, clients and audit"
    login_form = ThrottledLoginForm  # the consent page signs in here too
