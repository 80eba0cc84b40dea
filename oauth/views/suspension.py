"""Suspending and resuming a credential from its page (oauth.suspension): a bearer token, or a connected app for
every user or for one. Each is a confirmation (GET) that says what changes, then the change (POST) and a redirect
back to the credential's page."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.contrib.auth import get_user_model
from django.contrib.auth.base_user import AbstractBaseUser
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from oauth2_provider.models import Application

from audit.log import request_actor
from oauth.credential_activity import app_calls, bearer_calls, running_count
from oauth.models import BearerToken
from oauth.suspension import resume_app, resume_token, suspend_app, suspend_token, suspended_users

SUSPEND, RESUME = "suspend", "resume"


def confirmation(
    model_admin: admin.ModelAdmin[Any], request: HttpRequest, action: str, subject: str, back: str, **extra: Any
) -> TemplateResponse:
    context = {
        **model_admin.admin_site.each_context(request),
        "opts": model_admin.opts,
        "title": f"{action.capitalize()} {subject}?",
        "action": action,
        "subject": subject,
        "back": back,
        "media": model_admin.media,
        **extra,
    }
    return TemplateResponse(request, "admin/oauth/suspend.html", context)


def token_suspension(
    model_admin: admin.ModelAdmin[BearerToken], request: HttpRequest, token: BearerToken, action: str
) -> HttpResponse:
    token_url = reverse("admin:oauth_bearertoken_change", args=[token.pk])
    subject = f"token “{token.name}”"
    if token.revoked_at is not None:
        messages.info(request, f"Token “{token.name}” is revoked: there is nothing to {action}.")
        return HttpResponseRedirect(token_url)
    if request.method != "POST":
        running = running_count(bearer_calls(token.pk)) if action == SUSPEND else 0
        return confirmation(model_admin, request, action, subject, token_url, running=running,
                            suspended=token.suspended_at is not None)  # fmt: skip
    actor = request_actor(request)
    if action == SUSPEND:
        done = suspend_token(token, actor, stop_background=request.POST.get("stop_background") == "on")
    else:
        done = resume_token(token, actor)
    say(request, done, action, f"Token “{token.name}”")
    return HttpResponseRedirect(token_url)


def app_suspension(
    model_admin: admin.ModelAdmin[Application], request: HttpRequest, application: Application, action: str
) -> HttpResponse:
    app_url = reverse("admin:oauth_connectedapp_change", args=[application.pk])
    user = chosen_user(request)
    name = application.name or application.client_id
    subject = f"connected app “{name}”" + (f" for {user.get_username()}" if user is not None else "")
    every, each = suspended_users(application)
    suspended = (every if user is None else each.get(user.pk)) is not None
    if request.method != "POST":
        running = running_count(app_calls(application.name, application.client_id)) if action == SUSPEND else 0
        return confirmation(model_admin, request, action, subject, app_url, running=running, suspended=suspended,
                            user=user, for_every_user=user is None, also_every=every is not None,
                            connected_app=True)  # fmt: skip
    actor = request_actor(request)
    if action == SUSPEND:
        done = suspend_app(application, user, actor, stop_background=request.POST.get("stop_background") == "on")
    else:
        done = resume_app(application, user, actor)
    say(request, done, action, subject[0].upper() + subject[1:])
    return HttpResponseRedirect(app_url)


def chosen_user(request: HttpRequest) -> AbstractBaseUser | None:
    """The user of `?user=` (or the form's `user`): one user's use of an app; none given, every user's. A user that
    is named but not found is a 404, never every user."""
    raw = request.POST.get("user") or request.GET.get("user")
    if raw is None:
        return None
    user = get_user_model().objects.filter(pk=int(raw)).first() if raw.isdigit() and len(raw) <= 18 else None
    if user is None:
        raise Http404("No such user.")
    return user


def say(request: HttpRequest, done: bool, action: str, subject: str) -> None:
    if action == SUSPEND and done:
        text = (f"{subject} is suspended: its requests are refused, saying so, until it is resumed; its running tool "
                "calls were cancelled.")  # fmt: skip
    elif action == SUSPEND:
        text = f"{subject} was suspended already."
    elif done:
        text = f"{subject} is resumed: it works again from its next request."
    else:
        text = f"{subject} was not suspended."
    messages.add_message(request, messages.SUCCESS if done else messages.INFO, text)
