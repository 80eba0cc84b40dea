"""The console's lists of credentials and approvals and its other stock pages, through Django's test client: titles
in words instead of Django's "Select … to change", a sign-out page that says what signing out does, no "View site"
that loops back, statuses as coloured words (a token's, a connected app's), and one date format naming its zone.
How the lists fit a 1280 px window is tests/test_console_lists_browser.py's."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib import admin
from django.contrib.auth.models import User
from django.test import Client, RequestFactory, override_settings
from django.utils import timezone
from django.utils.formats import date_format
from oauth2_provider.models import AccessToken, Application, RefreshToken

from oauth.models import BearerToken, ClientRegistration
from oauth.tokens import issue_token

pytestmark = [pytest.mark.inprocess, pytest.mark.django_db]

LISTS = {
    "/admin/oauth/bearertoken/": "Bearer tokens",
    "/admin/oauth/connectedapp/": "Connected apps",
    "/admin/oauth/connectedappaccesstoken/": "Connected-app access tokens",
    "/admin/oauth/connectedapprefreshtoken/": "Connected-app refresh tokens",
    "/admin/mcpserver/approvalrequest/": "Approval requests",
    "/admin/mcpserver/approvalgrant/": "Approval grants",
}
STOCK_TEXTS = ("Thanks for spending some quality time", "View site", "Django site admin", "Django administration")
# A date in a list's cell: the date, and under it the time and the zone (oauth.console_lists.moment).
MOMENT = r'<span class="list-moment">\d{4}-\d{2}-\d{2} <span class="list-clock">\d{2}:\d{2}:\d{2} UTC</span>'


def row_of(page: str, name: str) -> str:
    """The list's row that names `name`."""
    return next(row.split("</tr>")[0] for row in page.split("<tr")[1:] if f">{name}<" in row)


@pytest.mark.parametrize(("url", "title"), LISTS.items())
def test_each_list_is_titled_in_words_with_no_stock_text(admin_client: Client, url: str, title: str) -> None:
    page = admin_client.get(url).content.decode()
    assert f"<h1>{title}</h1>" in page and f"<title>{title} | Sandstorm admin</title>" in page
    assert not re.search(r"Select [\w -]+ to (change|view)", page)
    assert not any(text in page for text in STOCK_TEXTS)
    assert 'id="changelist-filter"' not in page  # the filters are a bar above the rows, not a column beside them


def test_signing_out_says_what_it_stops_and_what_it_does_not(admin_client: Client) -> None:
    assert "View site" not in admin_client.get("/admin/").content.decode()
    page = admin_client.post("/admin/logout/").content.decode()
    assert "<h1>Signed out</h1>" in page and "Agents keep working" in page and 'href="/admin/login/"' in page
    assert not any(text in page for text in STOCK_TEXTS)


def test_the_token_list_shows_each_status_as_a_word_and_its_dates_with_their_zone(
    admin_client: Client, admin_user: User
) -> None:
    active, _ = issue_token(admin_user, "active-one", expires_days=7)
    expired, _ = issue_token(admin_user, "expired-one")
    revoked, _ = issue_token(admin_user, "revoked-one")
    BearerToken.objects.filter(pk=expired.pk).update(expires_at=timezone.now() - timedelta(days=1))
    BearerToken.objects.filter(pk=revoked.pk).update(revoked_at=timezone.now())
    page = admin_client.get("/admin/oauth/bearertoken/").content.decode()
    for name, status in (("active-one", "active"), ("expired-one", "expired"), ("revoked-one", "revoked")):
        row = row_of(page, name)
        assert f'<span class="credential-status credential-status-{status}">{status}</span>' in row, name
        assert "admin" in row and "mcp" in row, name
    assert re.search(rf'field-expires">{MOMENT}', row_of(page, "active-one"))
    assert 'field-last_used">never' in row_of(page, "active-one")
    only_revoked = admin_client.get("/admin/oauth/bearertoken/?status=revoked").content.decode()
    assert ">revoked-one<" in only_revoked
    assert ">active-one<" not in only_revoked and ">expired-one<" not in only_revoked


def test_a_connected_app_is_active_expired_revoked_or_unused(admin_client: Client, admin_user: User) -> None:
    now = timezone.now()

    def app(name: str) -> Application:
        made = Application.objects.create(name=name, client_type="public", authorization_grant_type="authorization-code",
                                          redirect_uris="https://claude.ai/cb")  # fmt: skip
        ClientRegistration.objects.create(application=made, source="dcr",
                                          last_token_at=None if name == "app-unused" else now)  # fmt: skip
        return made

    def tokens(application: Application, expires: datetime, revoked: datetime | None) -> None:
        access = AccessToken.objects.create(application=application, user=admin_user, scope="mcp",
                                            token=f"a-{application.pk}", expires=expires)  # fmt: skip
        RefreshToken.objects.create(application=application, user=admin_user, token=f"r-{application.pk}",
                                    access_token=access, revoked=revoked)  # fmt: skip

    tokens(app("app-active"), now + timedelta(hours=1), None)
    tokens(app("app-lapsed"), now - timedelta(days=40), None)  # past the refresh token's 30 idle days
    tokens(app("app-revoked"), now - timedelta(hours=1), now)
    app("app-unused")
    page = admin_client.get("/admin/oauth/connectedapp/").content.decode()
    for name, status in (("active", "active"), ("lapsed", "expired"), ("revoked", "revoked"), ("unused", "unused")):
        assert f'credential-status-{status}">{status}<' in row_of(page, f"app-{name}"), name
    active = row_of(page, "app-active")
    assert "admin" in active and ">mcp<" in active
    assert re.search(rf'field-expires">{MOMENT}', active)  # its refresh token's idle limit


def test_one_date_format_names_its_zone_in_the_server_time_zone(admin_client: Client, admin_user: User) -> None:
    moment = datetime(2026, 12, 7, 15, 4, 5, tzinfo=UTC)
    assert date_format(timezone.localtime(moment), "DATETIME_FORMAT") == "2026-12-07 15:04:05 UTC"
    with override_settings(TIME_ZONE="Europe/Paris"):
        assert date_format(timezone.localtime(moment), "DATETIME_FORMAT") == "2026-12-07 16:04:05 CET"
    token, _ = issue_token(admin_user, "dated")
    BearerToken.objects.filter(pk=token.pk).update(created_at=moment)
    page = admin_client.get(f"/admin/oauth/bearertoken/{token.pk}/change/").content.decode()
    assert "<dt>Created</dt><dd>2026-12-07 15:04:05 UTC</dd>" in page
    AccessToken.objects.create(user=admin_user, scope="mcp", token="dated", expires=moment)
    listed = admin_client.get("/admin/oauth/connectedappaccesstoken/").content.decode()  # a stock admin cell
    assert "2026-12-07 15:04:05 UTC" in listed


def heading_and_title(page: str) -> tuple[str, str]:
    heading, title = re.search(r"<h1>(.*?)</h1>", page, re.S), re.search(r"<title>(.*?)</title>", page, re.S)
    assert heading is not None and title is not None
    return heading.group(1), title.group(1)


def test_no_list_of_the_console_is_titled_select_to_change_or_to_view(admin_client: Client, admin_user: User) -> None:
    request = RequestFactory().get("/admin/")
    request.user = admin_user
    lists = [model["admin_url"] for app in admin.site.get_app_list(request) for model in app["models"]]
    assert {"/admin/auth/user/", "/admin/auth/group/", "/admin/audit/securityevent/"} <= set(lists)
    titles = {}
    for url in lists:
        response = admin_client.get(url, follow=True)  # a list that is a page of its own (the policy) redirects
        assert response.status_code == 200, url
        titles[url] = heading_and_title(response.content.decode())
    stock = {url: shown for url, shown in titles.items() if re.search(r"Select .* to (change|view)", " ".join(shown))}
    assert stock == {}
    for url, heading in (
        ("/admin/auth/user/", "Users"),
        ("/admin/auth/group/", "Groups"),
        ("/admin/audit/securityevent/", "Security events"),
        ("/admin/mcpserver/backgroundprocess/", "Background commands"),
    ):
        assert titles[url] == (heading, f"{heading} | Sandstorm admin"), url
