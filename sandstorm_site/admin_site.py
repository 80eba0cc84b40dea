"""The console: Django's admin site, as this project's own class (Django's `default_site` hook), so that sign-in,
the home page and who may enter are decided here rather than by patching the stock site after import.

Sign-in has a second step for staff (oauth/second_factor.py): after the password, the code of a second factor for
those who set one up (or everyone, with SANDSTORM_REQUIRE_SECOND_FACTOR), else the offer to set one up. Until a
session owes nothing, `has_permission` is false: every admin page sends it to the sign-in page, which sends it on
to the step it still has to take.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, URLResolver, path

from oauth import second_factor
from oauth.throttle import ThrottledLoginForm
from oauth.views import second_factor as second_factor_views


class SandstormAdminSite(admin.AdminSite):
    site_header = "Sandstorm"
    site_title = "Sandstorm admin"
    index_title = "Status"
    login_form = ThrottledLoginForm  # the consent page signs in here too
    site_url = None  # no "View site": the site's root is this console
    logout_template = "admin/logged_out.html"

    def index(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> TemplateResponse:
        """A status page (sandstorm_site.home) above the stock list of models."""
        from sandstorm_site.home import status_context  # models are not ready when the site class is imported

        return super().index(request, {**status_context(), **(extra_context or {})})

    def has_permission(self, request: HttpRequest) -> bool:
        return super().has_permission(request) and second_factor.is_satisfied(request)

    def login(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        if request.method == "GET":
            # Signed in with the password but a step short: that step, not the password form again.
            step = second_factor.pending_step(request, second_factor.safe_next(request, request.GET.get("next")))
            if step is not None and second_factor.is_staff(request.user):
                return HttpResponseRedirect(step)
        # Coming from an OAuth authorization request: the look of the consent card, naming the application that
        # asks (templates/admin/login.html chooses).
        from sandstorm_site.sign_in import sign_in_context  # models are not ready when the site class is imported

        response = super().login(request, {**sign_in_context(request), **(extra_context or {})})
        if request.method == "POST" and response.status_code == 302 and request.user.is_authenticated:
            # The password was right; where Django would go next (`next`, validated by its login view) waits.
            going_to = second_factor.safe_next(request, response["Location"])
            step = second_factor.after_password_step(request, going_to)
            if step is not None:
                return HttpResponseRedirect(step)
        return response

    def get_urls(self) -> list[URLResolver | URLPattern]:
        from mcpserver import live_views, session_views  # models are not ready when the site class is imported

        site = {"site": self}
        steps: list[URLResolver | URLPattern] = [
            path("second-factor/", second_factor_views.verify, site, name="second_factor_verify"),
            path("second-factor/offer/", second_factor_views.offer, site, name="second_factor_offer"),
            path("second-factor/set-up/", second_factor_views.setup, site, name="second_factor_setup"),
            path(
                "second-factor/recovery-codes/<str:ticket>/",
                second_factor_views.recovery_codes,
                site,
                name="second_factor_recovery_codes",
            ),
            path("second-factor/sign-out/", second_factor_views.sign_out, site, name="second_factor_sign_out"),
            # What agents are doing now (its socket, /admin/live/socket, is routed in sandstorm_site/asgi.py).
            path("live/", self.admin_view(live_views.live), site, name="live"),
            # The MCP sessions open in every worker, and disconnecting one.
            path("sessions/", self.admin_view(session_views.sessions_page), site, name="mcp_sessions"),
            path(
                "sessions/<str:session_id>/disconnect/",
                self.admin_view(session_views.disconnect),
                site,
                name="mcp_session_disconnect",
            ),
        ]
        return steps + super().get_urls()  # before the admin's catch-all
