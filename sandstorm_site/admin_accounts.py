"""The console's pages of users and groups: Django's own admins, registered again on this project's site with a
title in words ("Users") instead of Django's "Select user to change", like every other list of the console.

Registered by SandstormAdminConfig.ready, after the admin's autodiscovery has registered Django's.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.auth.admin import GroupAdmin, UserAdmin
from django.contrib.auth.models import Group, User
from django.http import HttpRequest, HttpResponse
from django.utils.text import capfirst


class TitledList(admin.ModelAdmin):
    """A list titled by its model's plural name, whatever the viewer may do with the rows."""

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        title = capfirst(str(self.opts.verbose_name_plural))
        return super().changelist_view(request, {"title": title, **(extra_context or {})})


class AccountUserAdmin(TitledList, UserAdmin):
    pass


class AccountGroupAdmin(TitledList, GroupAdmin):
    pass


def register(site: admin.AdminSite) -> None:
    """Put the titled admins of users and groups in place of Django's on `site`."""
    for model, model_admin in ((User, AccountUserAdmin), (Group, AccountGroupAdmin)):
        if site.is_registered(model):
            site.unregister(model)
        site.register(model, model_admin)
