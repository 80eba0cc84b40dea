"""The authorization endpoint's consent page: the toolkit's AuthorizationView with our rules and our page.

- A staff user must be signed in (the admin's login page); the tokens belong to whoever approves. One who owes a
  second factor (oauth/second_factor.py) gives it first: neither the page nor an approval before that.
- The page is always shown: `approval_prompt=auto` and `skip_authorization` never approve silently.
- It names the client, the host it redirects to (warning for loopback and for clients registered minutes ago) and
  the scope in plain words; Approve / Deny; CSRF; `X-Frame-Options: DENY` and a strict Content-Security-Policy.
- Only `S256` PKCE and only our resource are accepted, refused before the page is shown.
- It says how long access lasts, and offers "Approve read-only instead" when the client asked for `mcp`.
- An app that holds read-only access for the signed-in user and asks for `mcp` (its client stepping up after a
  `403 insufficient_scope` at /mcp: mcpserver.step_up) is shown as an upgrade of that connection: approving grants
  full access, denying leaves the read-only access working; the audit record says it was an upgrade.
- For `mcp`, it says which confinement profile the app's commands will get (oauth.confinement); an approver who may
  change connected apps chooses it here, anyone else sees it read-only. For `mcp:read`, that no profile is needed.
- Every decision is recorded in the audit log; Deny sends `access_denied` (with `iss`) to the client.
- A client ID metadata document that could not be fetched is explained (oauth.metadata_documents), not left as
  "Invalid client_id parameter value.".
- An app an admin suspended (for every user, or for the one signed in: oauth.suspension) is not offered for approval:
  approving would not resume it, and the token endpoint would refuse its code (oauth.policy). The page (403) says
  who suspended it and when, and what to do; its one button tells the client no (`access_denied`), as Deny does.
"""

from __future__ import annotations

import socket
from datetime import timedelta
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from django.conf import settings
from django.contrib.auth import get_permission_codename
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.decorators import method_decorator
from oauth2_provider.exceptions import OAuthToolkitError
from oauth2_provider.models import Application
from oauth2_provider.views import AuthorizationView
from oauth2_provider.views.mixins import OAuthLibMixin
from oauthlib.oauth2.rfc6749 import errors

from audit.log import event, request_actor
from oauth import confinement
from oauth.agent_identity import agent_os_user
from oauth.app_status import live_scopes
from oauth.credentials import application_label
from oauth.lifetimes import access_duration_text
from oauth.metadata_documents import unknown_client_explanation
from oauth.models import SCOPE_ALL, SCOPE_READ, AppConfinement, ClientRegistration, ConnectedApp
from oauth.policy import resource_target_error
from oauth.redirects import is_loopback, redirect_host
from oauth.second_factor import second_factor_required
from oauth.suspension import suspension_of

RECENT_REGISTRATION = timedelta(minutes=10)
SUSPENDED_TEMPLATE = "oauth/suspended.html"
CSP = (
    "default-src 'none'; style-src 'self'; img-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
)


# The consent form's second approve button: the same grant with `mcp:read` in place of `mcp`.
READ_ONLY_FIELD = "read_only"
# The confinement profile the approver chooses for the app's full-scope calls as them (oauth.confinement).
CONFINEMENT_FIELD = "confinement"
BAD_CONFINEMENT = "The confinement profile must be workspace, host or the installation's default; nothing was approved."


def scope_descriptions(scopes: list[str], user: str) -> list[str]:
    host, workspace = socket.gethostname(), settings.WORKSPACE_ROOT
    if SCOPE_ALL in scopes:
        return [
            f"Run any command as {user} on this host ({host}).",
            f"Read, change and delete any file in the workspace {workspace}, use git there and install packages.",
        ]
    if SCOPE_READ in scopes:
        return [
            f"Read files, list directories and read git status, diffs and history in the workspace {workspace}, "
            f"as {user} on this host ({host}). No commands and no changes.",
            f"Confinement: {confinement.READ_ONLY_WORDS}.",
        ]
    return []


def may_choose_confinement(user: Any) -> bool:
    """Whoever may change a connected app (and revoke it) chooses its profile here; anyone else sees it read-only."""
    opts = ConnectedApp._meta
    return bool(user.has_perm(f"{opts.app_label}.{get_permission_codename('change', opts)}"))


def confinement_context(application: Application | None, scopes: list[str], approver: Any, user: str) -> dict[str, Any]:
    """The consent card's confinement line: the profile that will apply to the app's full-scope calls, and the
    choice, for an approver who may make it."""
    if application is None or SCOPE_ALL not in scopes:
        return {}
    current = confinement.app_confinement(application, approver.pk)
    chooses = may_choose_confinement(approver)
    return {
        "confinement_field": CONFINEMENT_FIELD,
        "confinement_current": current,
        "confinement_line": confinement.choice_line(current, SCOPE_ALL, user),
        "confinement_applied": confinement.applied(current),
        "confinement_label": confinement.choice_label(current),
        "confinement_note": confinement.enforcement_note(current, SCOPE_ALL),
        "confinement_choices": confinement.form_choices(user) if chooses else [],
    }


def upgrade_from(application: Application | None, scopes: list[str], approver: Any) -> str:
    """The scope the app already holds for the approver, if this request asks for more (`mcp` where it holds only
    `mcp:read`): the card is an upgrade of that connection. "" if it is not."""
    if application is None or SCOPE_ALL not in scopes:
        return ""
    held = live_scopes(application, approver.pk, timezone.now())
    return SCOPE_READ if SCOPE_READ in held and SCOPE_ALL not in held else ""


def read_only_scope(scope: str) -> str:
    """`scope` with `mcp` replaced by `mcp:read` (the approver may narrow what the client asked for, never widen)."""
    scopes = [SCOPE_READ if name == SCOPE_ALL else name for name in scope.split()]
    return " ".join(dict.fromkeys(scopes))


def with_issuer(url: str) -> str:
    """`url` with the RFC 9207 `iss` parameter (the toolkit adds it to successful responses only)."""
    parts = urlsplit(url)
    query = [(key, value) for key, value in parse_qsl(parts.query, keep_blank_values=True) if key != "iss"]
    query.append(("iss", str(settings.OAUTH2_PROVIDER["OIDC_ISS_ENDPOINT"])))
    return urlunsplit(parts._replace(query=urlencode(query)))


def origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}"


@method_decorator(second_factor_required, name="dispatch")  # a staff user's second factor first, if they owe it
class ConsentView(AuthorizationView):
    template_name = "oauth/consent.html"

    def dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        user = request.user
        if user.is_authenticated and not (user.is_active and user.is_staff):
            return self.error_page(
                "access_denied", "Only staff users of this Sandstorm server can approve access.", 403
            )
        return super().dispatch(request, *args, **kwargs)

    def get(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        # approval_prompt=auto would skip this page for a client the user approved before: never allowed.
        if "approval_prompt" in request.GET:
            query = request.GET.copy()
            query.pop("approval_prompt")
            # The toolkit reads the parameters from request.GET: the copy without approval_prompt takes its place.
            request.GET = query  # type: ignore[assignment]  # django-stubs types request.GET as immutable
        return super().get(request, *args, **kwargs)

    def validate_authorization_request(self, request: HttpRequest) -> tuple[list[str], dict[str, Any]]:
        scopes, credentials = super().validate_authorization_request(request)
        state, redirect_uri = credentials.get("state"), credentials["redirect_uri"]
        if credentials.get("code_challenge_method") != "S256":
            description = "PKCE with code_challenge_method=S256 is required"
            raise OAuthToolkitError(
                errors.InvalidRequestError(description=description, state=state), redirect_uri=redirect_uri
            )
        target_error = resource_target_error(request.GET.getlist("resource"), state=state)
        if target_error is not None:
            raise OAuthToolkitError(target_error, redirect_uri=redirect_uri)
        return scopes, credentials

    def create_authorization_response(
        self, request: HttpRequest, scopes: str, credentials: dict[str, Any], allow: bool
    ) -> Any:
        if request.method != "POST":
            # Only the consent form approves (the toolkit would also approve on GET for skip_authorization).
            raise OAuthToolkitError(
                errors.ConsentRequired(state=credentials.get("state")), redirect_uri=credentials["redirect_uri"]
            )
        return super().create_authorization_response(request, scopes, credentials, allow)

    def get_initial(self) -> dict[str, Any]:
        initial = super().get_initial()
        initial["resource"] = settings.MCP_RESOURCE_URL  # the only resource; validated above when given
        return initial

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        application: Application | None = context.get("application")
        redirect_uri = context.get("redirect_uri") or ""
        if application is not None:
            registration = ClientRegistration.objects.filter(application=application).first()
            registered_at = registration.registered_at if registration else application.created
            age = timezone.now() - registered_at
            context.update(
                client_name=application.name or "(unnamed client)",
                client_id=application.client_id,
                registration_source=application.get_registration_source_display(),
                registered_minutes_ago=int(age.total_seconds() // 60) if age < RECENT_REGISTRATION else None,
            )
            context.update(self.suspension_context(application))
        user = agent_os_user()
        scopes = context.get("scopes") or []
        context.update(confinement_context(application, scopes, self.request.user, user))
        # An upgrade offers no read-only approval: the app has that already, and keeps it if the answer is no.
        upgrade = upgrade_from(application, scopes, self.request.user)
        context.update(
            redirect_host=redirect_host(redirect_uri),
            redirect_is_loopback=is_loopback(redirect_uri),
            scope_lines=scope_descriptions(scopes, user),
            agent_user=user,
            access_duration=access_duration_text(),
            read_only_field=READ_ONLY_FIELD,
            read_only_offer=scope_descriptions([SCOPE_READ], user)[0] if SCOPE_ALL in scopes and not upgrade else "",
            upgrade_from=upgrade,
        )
        return context

    def suspension_context(self, application: Application) -> dict[str, Any]:
        """The app's suspension that keeps it out for the signed-in user (None: the card is shown), and its page in
        the console for a user who may resume it there."""
        suspension = suspension_of(application, self.request.user.pk)
        may_resume = suspension is not None and may_choose_confinement(self.request.user)
        return {
            "suspension": suspension,
            "app_url": reverse("admin:oauth_connectedapp_change", args=[application.pk]) if may_resume else "",
        }

    def render_to_response(self, context: dict[str, Any], **response_kwargs: Any) -> HttpResponse:
        if context.get("suspension") is not None:
            response: HttpResponse = TemplateResponse(self.request, SUSPENDED_TEMPLATE, context, status=403)
        else:
            response = super().render_to_response(context, **response_kwargs)
        return self.protect(response, context.get("redirect_uri"))

    def protect(self, response: HttpResponse, redirect_uri: str | None = None) -> HttpResponse:
        # The form posts here and the answer redirects to the client: form-action must allow that origin too.
        response["Content-Security-Policy"] = CSP + (f" {origin(redirect_uri)}" if redirect_uri else "")
        response["X-Frame-Options"] = "DENY"
        response["Cache-Control"] = "no-store"
        return response

    def error_page(
        self, error: str, description: str, status: int, explanation: dict[str, Any] | None = None
    ) -> HttpResponse:
        context = {"error": error, "description": description, "explanation": explanation}
        return self.protect(TemplateResponse(self.request, "oauth/error.html", context, status=status))

    def error_response(self, error: OAuthToolkitError, application: Application | None, **kwargs: Any) -> HttpResponse:
        redirect, response = OAuthLibMixin.error_response(self, error, **kwargs)
        if redirect:
            return self.redirect(response["url"], application)
        oauthlib_error = response["error"]
        explanation = None
        if isinstance(oauthlib_error, errors.InvalidClientIdError):
            explanation = unknown_client_explanation(self.request.GET.get("client_id", ""))
        return self.error_page(
            oauthlib_error.error, oauthlib_error.description, oauthlib_error.status_code, explanation
        )

    def redirect(self, redirect_to: str, application: Application | None) -> HttpResponse:
        return super().redirect(with_issuer(redirect_to), application)

    def form_invalid(self, form: Any) -> HttpResponse:
        return self.error_page("invalid_request", "The consent form was incomplete; start again from the client.", 400)

    def form_valid(self, form: Any) -> HttpResponse:
        client_id = form.cleaned_data["client_id"]
        application = Application.objects.filter(client_id=client_id).first()
        if application is None:
            return self.error_page("invalid_client", "This client is not registered here.", 400)
        choice = self.request.POST.get(CONFINEMENT_FIELD)
        if choice is not None and choice not in confinement.CHOICES:
            return self.error_page("invalid_request", BAD_CONFINEMENT, 400)
        if self.request.POST.get(READ_ONLY_FIELD):
            # "Approve read-only instead": an approval, of the narrower scope.
            form.cleaned_data["allow"] = True
            form.cleaned_data["scope"] = read_only_scope(form.cleaned_data.get("scope", ""))
        if form.cleaned_data.get("allow") and suspension_of(application, self.request.user.pk) is not None:
            # Suspended since the card was shown: nothing is approved (a denial goes through, telling the client).
            redirect_uri = form.cleaned_data.get("redirect_uri", "")
            return self.render_to_response(self.get_context_data(form=form, application=application,
                                                                 redirect_uri=redirect_uri))  # fmt: skip
        upgrade = upgrade_from(application, form.cleaned_data.get("scope", "").split(), self.request.user)
        response = super().form_valid(form)
        location = response.get("Location", "")
        query = dict(parse_qsl(urlsplit(location).query))
        details: dict[str, Any] = {"upgrade_from": upgrade} if upgrade else {}
        if "code" in query and SCOPE_ALL in form.cleaned_data.get("scope", "").split():
            details |= {
                "confinement": self.keep_confinement(application, choice),
                "default": confinement.installation_default(),
            }
        event(
            "oauth.consent",
            request_actor(self.request),
            client=application_label(application.name, application.client_id),
            client_id=application.client_id,
            scope=form.cleaned_data.get("scope", ""),
            redirect_host=redirect_host(form.cleaned_data.get("redirect_uri", "")),
            decision="approved" if form.cleaned_data.get("allow") else "denied",
            outcome="code issued" if "code" in query else query.get("error", "no redirect"),
            **details,
        )
        return response

    def keep_confinement(self, application: Application, choice: str | None) -> str:
        """The app's profile for the approver after this approval: the one chosen, if they may choose (the change
        recorded by oauth.confinement), else the one it had (a new approval: the installation's default)."""
        approver = self.request.user
        if choice is not None and may_choose_confinement(approver):
            confinement.change_app_confinement(application, approver, choice, request_actor(self.request))
            return choice
        row, _ = AppConfinement.objects.get_or_create(application=application, user_id=approver.pk)
        return row.confinement
