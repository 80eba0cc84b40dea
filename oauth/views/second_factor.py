"""The staff sign-in's second step (oauth/second_factor.py says who takes it): the offer to set up a second factor,
its set-up (a QR code drawn here as SVG, the key in base32, a code to confirm, then 10 recovery codes shown once),
and the code asked for at each sign-in once set up. Pages of the admin site (sandstorm_site/admin_site.py adds
their URLs), for a staff user who has given the right password; none needs JavaScript.
"""

from __future__ import annotations

import hashlib
import math
from base64 import b32encode
from typing import Any
from urllib.parse import urlencode

import django_otp
import segno
from django import forms
from django.contrib import admin
from django.contrib.auth import logout
from django.core.cache import cache
from django.db import transaction
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.safestring import mark_safe
from django_otp.plugins.otp_static.models import StaticDevice, StaticToken
from django_otp.plugins.otp_totp.models import TOTPDevice

from audit.log import event, request_actor
from oauth import shown_once
from oauth.second_factor import (
    is_enrolled,
    is_staff,
    is_verified,
    pending_step,
    required_for_everyone,
    safe_next,
    step_url,
)
from oauth.second_factor_throttle import code_wait, count_wrong_code, forgive
from oauth.throttle import ADDRESS_WINDOW, address_key, client_address, in_words

RECOVERY_CODES = 10
SHOWN_ONCE_KIND = "recovery-codes"
TOTP_NAME = "authenticator app"
RECOVERY_NAME = "recovery codes"


class CodeForm(forms.Form):
    code = forms.CharField(
        label="Code",
        max_length=64,
        widget=forms.TextInput(attrs={"autocomplete": "one-time-code", "autofocus": True, "spellcheck": "false"}),
    )

    def normalized(self) -> str:
        """The code without spaces or dashes, in lower case (recovery codes are shown in groups)."""
        return "".join(str(self.cleaned_data["code"]).split()).replace("-", "").lower()


def _page(request: HttpRequest, site: admin.AdminSite, template: str, context: dict[str, Any]) -> HttpResponse:
    # The admin's look, without its navigation: the session may not enter the admin yet.
    full = {**site.each_context(request), "is_nav_sidebar_enabled": False, "available_apps": [], **context}
    response = TemplateResponse(request, f"admin/second_factor/{template}", full)
    response["Cache-Control"] = "no-store"
    return response


def _next(request: HttpRequest) -> str:
    return safe_next(request, request.POST.get("next") or request.GET.get("next"))


def _password_first(request: HttpRequest) -> HttpResponse | None:
    """A redirect to the password sign-in unless a staff user has given theirs in this session."""
    if is_staff(request.user):
        return None
    return HttpResponseRedirect(step_url("admin:login", _next(request)))


def _wait_words(until: Any) -> str:
    return in_words(max(1, math.ceil((until - timezone.now()).total_seconds())))


def _record_throttled(request: HttpRequest, how: str) -> None:
    # Once per window, user and address, so a flood of attempts cannot fill the audit log.
    marker = hashlib.sha256(f"{request.user.pk}\n{address_key(client_address(request))}".encode()).hexdigest()
    if cache.add(f"sandstorm:second-factor-throttled:{marker}", True, int(ADDRESS_WINDOW.total_seconds())):
        event("admin.second_factor_throttled", request_actor(request), by=how)


def verify(request: HttpRequest, site: admin.AdminSite) -> HttpResponse:
    """The code asked for at sign-in: one from the authenticator app, or a recovery code (each works once)."""
    refused = _password_first(request)
    if refused is not None:
        return refused
    next_url = _next(request)
    if is_verified(request) or not is_enrolled(request.user):
        return HttpResponseRedirect(pending_step(request, next_url) or next_url)
    form = CodeForm(request.POST if request.method == "POST" else None)
    if request.method == "POST" and form.is_valid():
        answer = _check_code(request, form)
        if answer is None:
            return HttpResponseRedirect(next_url)
        form.add_error("code", answer)
    context = {"title": "Second factor", "form": form, "next": next_url, "username": request.user.get_username()}
    return _page(request, site, "verify.html", context)


def _check_code(request: HttpRequest, form: CodeForm) -> str | None:
    """Verify the form's code for the signed-in user; None on success (the session is then verified), else what to
    tell them."""
    user = request.user
    address = address_key(client_address(request))
    username = user.get_username()
    wait = code_wait(username, address)
    if wait:
        _record_throttled(request, "sign-in throttle")
        return f"Too many wrong codes for this user from this address. Try again in {in_words(wait)}."
    code = form.normalized()
    totp = TOTPDevice.objects.filter(user=user, confirmed=True).order_by("id").first()
    recovery = StaticDevice.objects.filter(user=user, confirmed=True).order_by("id").first()
    device = totp if code.isdigit() and totp is not None else recovery
    how = "authenticator app" if device is totp else "recovery code"
    if device is None:
        return "That is neither a code from your authenticator app nor one of your recovery codes."
    allowed, details = device.verify_is_allowed()
    if not allowed:
        _record_throttled(request, how)
        until = (details or {}).get("locked_until")
        later = f" Try again in {_wait_words(until)}." if until else " Try again later."
        return f"Too many wrong codes in a row.{later}"
    verified = django_otp.verify_token(user, device.persistent_id, code)
    if verified is None:
        count_wrong_code(username, address)
        event("admin.second_factor_failed", request_actor(request), by=how)
        if how == "recovery code":
            return "That is not one of your unused recovery codes (each works once). Check it and try again."
        return "That code is not right. Enter the 6 digits your authenticator app shows now."
    django_otp.login(request, verified)
    request.session.cycle_key()
    forgive(username, address)
    if isinstance(verified, StaticDevice):
        left = verified.token_set.count()
        event("admin.recovery_code_used", request_actor(request), recovery_codes_left=left)
    else:
        event("admin.second_factor_verified", request_actor(request), by=how)
    return None


def _before_set_up(request: HttpRequest) -> tuple[str, HttpResponse | None]:
    """`next`, and where the offer and set-up pages send a request instead of answering it: to the password first,
    or, for a user who has set up already, on through the code (a second set-up would need it anyway)."""
    refused = _password_first(request)
    if refused is not None:
        return "", refused
    next_url = _next(request)
    if is_enrolled(request.user):
        return next_url, HttpResponseRedirect(pending_step(request, next_url) or next_url)
    return next_url, None


def offer(request: HttpRequest, site: admin.AdminSite) -> HttpResponse:
    """After the password: set up a second factor now, or (unless it is required) not now."""
    next_url, elsewhere = _before_set_up(request)
    if elsewhere is not None:
        return elsewhere
    context = {
        "title": "Set up a second factor",
        "required": required_for_everyone(),
        "next": next_url,
        "setup_url": step_url("admin:second_factor_setup", next_url),
    }
    return _page(request, site, "offer.html", context)


def _pending_device(user: Any) -> TOTPDevice:
    """The user's TOTP device awaiting confirmation (the same one on every reload of the set-up page)."""
    device = TOTPDevice.objects.filter(user=user, confirmed=False).order_by("-id").first()
    if device is None:
        device = TOTPDevice.objects.create(user=user, name=TOTP_NAME, confirmed=False)
    return device


def _grouped(text: str, size: int = 4) -> str:
    return " ".join(text[i : i + size] for i in range(0, len(text), size))


def setup(request: HttpRequest, site: admin.AdminSite) -> HttpResponse:
    """The QR code and key of a new TOTP device, and a code from it to confirm; then the recovery codes."""
    next_url, elsewhere = _before_set_up(request)
    if elsewhere is not None:
        return elsewhere
    device = _pending_device(request.user)
    form = CodeForm(request.POST if request.method == "POST" else None)
    if request.method == "POST" and form.is_valid():
        allowed, details = device.verify_is_allowed()
        if not allowed:
            until = (details or {}).get("locked_until")
            later = f" Try again in {_wait_words(until)}." if until else " Try again later."
            form.add_error("code", f"Too many wrong codes in a row.{later}")
        else:
            ticket = _confirm(request, form)
            if ticket is not None:
                page = reverse("admin:second_factor_recovery_codes", args=[ticket])
                return HttpResponseRedirect(f"{page}?{urlencode({'next': next_url})}")
            form.add_error("code", "That code is not right. Enter the 6 digits the app shows now for this server.")
    # segno draws the QR code from our own otpauth: URL; the SVG is its output, no user-written markup in it.
    qr_svg = segno.make(device.config_url, error="m").svg_inline(scale=5, light="#fff", title="QR code to scan")
    context = {
        "title": "Set up a second factor",
        "form": form,
        "next": next_url,
        "qr_svg": mark_safe(qr_svg),
        "secret": _grouped(b32encode(device.bin_key).decode("ascii")),
        "issuer": site.site_header,
        "username": request.user.get_username(),
        "required": required_for_everyone(),
    }
    return _page(request, site, "setup.html", context)


def _confirm(request: HttpRequest, form: CodeForm) -> str | None:
    """Confirm the pending device with the form's code, make the recovery codes; the shown-once ticket, or None."""
    user = request.user
    with transaction.atomic():
        device = TOTPDevice.objects.select_for_update().filter(user=user, confirmed=False).order_by("-id").first()
        if device is None or not device.verify_token(form.normalized()):
            event("admin.second_factor_failed", request_actor(request), by="authenticator app", step="set-up")
            return None
        device.confirmed = True
        device.save(update_fields=["confirmed"])
        TOTPDevice.objects.filter(user=user, confirmed=False).delete()
        StaticDevice.objects.filter(user=user).delete()
        recovery = StaticDevice.objects.create(user=user, name=RECOVERY_NAME, confirmed=True)
        codes = [StaticToken.random_token() for _ in range(RECOVERY_CODES)]
        StaticToken.objects.bulk_create([StaticToken(device=recovery, token=code) for code in codes])
    django_otp.login(request, device)
    request.session.cycle_key()
    event("admin.second_factor_enrolled", request_actor(request), device=TOTP_NAME, recovery_codes=len(codes))
    return shown_once.keep(request, SHOWN_ONCE_KIND, {"codes": codes})


def recovery_codes(request: HttpRequest, site: admin.AdminSite, ticket: str) -> HttpResponse:
    """The recovery codes, once: a reload finds them gone and says so."""
    refused = _password_first(request)
    if refused is not None:
        return refused
    payload = shown_once.take(request, SHOWN_ONCE_KIND, ticket)
    codes = [_grouped(code) for code in payload["codes"]] if payload else []
    context = {"title": "Your recovery codes", "codes": codes, "shown": payload is None, "next": _next(request)}
    return _page(request, site, "recovery_codes.html", context)


def sign_out(request: HttpRequest, site: admin.AdminSite) -> HttpResponse:
    """Sign out from the second step (the admin's own sign-out is an admin page, closed until then)."""
    if request.method != "POST":
        return HttpResponseNotAllowed(["POST"])
    logout(request)
    return HttpResponseRedirect(reverse("admin:login"))
