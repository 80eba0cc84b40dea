"""The console: Django's admin site, as this project's own class (Django's `default_site` hook), so that sign-in,
the home page and who may enter are decided here rather than by patching the stock site after import."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from django.template.response import TemplateResponse

from oauth.throttle import ThrottledLoginForm


class SandstormAdminSite(admin.AdminSite):
    site_header = "Sandstorm"
    site_title = "Sandstorm admin"
    index_title = "Status"
    login_form = ThrottledLoginForm  # the consent page signs in here too

    def index(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> TemplateResponse:
        """A status page (sandstorm_site.home) above the stock list of models."""
        from sandstorm_site.home import status_context  # models are not ready when the site class is imported

        return super().index(request, {**status_context(), **(extra_context or {})})

    def login(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> Any:
        """The stock login; coming from an OAuth authorization request, in the look of the consent card and naming
        the application that asks (templates/admin/login.html chooses)."""
        from sandstorm_site.sign_in import sign_in_context

        return super().login(request, {**sign_in_context(request), **(extra_context or {})})
