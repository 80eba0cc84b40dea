"""The console's command policy page: the rules in order, each with Move up / Move down, Enable or Disable, Edit and
Delete; above them the policy's settings, the recommended set switched on or off, and the policy as JSON (what
`manage.py policy_export` writes).

Every change is one transaction that bumps the policy's version first (its row's lock makes concurrent changes take
turns; mcpserver.policy_source) and ends with a `policy.changed` audit record naming the action and the rules as
they were and became, so both commit or neither does. A rule is checked by the engine's own reader
(`policy_source.stored_rule`) before it is saved; its error is shown on the form field it is about. Every action is
a POST answered with a redirect, so a reload or Back repeats nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseBadRequest,
    HttpResponseNotAllowed,
    HttpResponseRedirect,
)
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.text import Truncator

from audit.log import event, request_actor
from mcpserver.models import PolicyRule, PolicySettings
from mcpserver.policy.recommended import RECOMMENDED
from mcpserver.policy.rules import PolicyError
from mcpserver.policy_forms import APPROVER_CHOICES, RuleForm, SettingsForm, command_line
from mcpserver.policy_source import (
    bump_version,
    document_text,
    load_policy,
    policy_document,
    policy_version,
    rule_entry,
    stored_rule,
)
from mcpserver.process import INSTANCE_ID

SHOWN = 3  # patterns or globs shown in a row before "and N more"
SHOWN_CHARS = 60
ACTIONS_BY_DIRECTION = {"up": "moved_up", "down": "moved_down"}


# --- changes: one transaction each, the version bumped, an audit record written ----------------------------------


class Unchanged(Exception):
    """Nothing to do; raised inside a change, it rolls the change back (no new version, no audit record)."""


@contextmanager
def policy_change(request: HttpRequest, action: str) -> Iterator[dict[str, Any]]:
    """One change of the policy. The body does the change and fills in the audit record's detail (rule_id or
    rule_ids, before, after); an exception, Unchanged included, leaves nothing changed."""
    with transaction.atomic():
        # First: the settings row's lock makes a concurrent change wait until this one commits.
        bump_version(request.user.get_username())
        detail: dict[str, Any] = {}
        yield detail
        event(
            "policy.changed",
            request_actor(request),
            instance_id=INSTANCE_ID,
            action=action,
            version=policy_version(),
            **detail,
        )


def ordered_rules() -> list[PolicyRule]:
    return list(PolicyRule.objects.order_by("position", "id"))


def renumber(rows: list[PolicyRule]) -> None:
    """Store the order of `rows` as their positions 10, 20, …; rows not saved yet only get theirs set."""
    for index, row in enumerate(rows):
        position = (index + 1) * 10
        if row.position != position:
            row.position = position
            if row.pk is not None:
                row.save(update_fields=["position"])


def recommended_specs() -> dict[str, dict[str, Any]]:
    """The recommended rules as the console stores them, by id."""
    return {spec["id"]: stored_rule(spec).to_dict() for spec in RECOMMENDED}


# --- what the page shows of a rule ----------------------------------------------------------------------------------


def shortened(entries: list[str]) -> dict[str, Any]:
    return {
        "shown": [Truncator(entry).chars(SHOWN_CHARS) for entry in entries[:SHOWN]],
        "more": max(0, len(entries) - SHOWN),
        "full": "\n".join(entries),
    }


def implied_tools(spec: dict[str, Any]) -> str:
    if spec.get("commands") and spec.get("paths"):
        return "the command tools and the tools with paths"
    if spec.get("commands"):
        return "the command tools"
    if spec.get("paths"):
        return "the tools with paths"
    return "every tool"


def who_text(spec: dict[str, Any]) -> str:
    who = spec.get("who") if isinstance(spec.get("who"), dict) else None
    if not who:
        return "anyone"
    parts = [f"{key} {', '.join(map(str, values))}" for key, values in who.items() if isinstance(values, list)]
    return "; ".join(parts)


def row_view(number: int, row: PolicyRule, recommended: dict[str, dict[str, Any]]) -> dict[str, Any]:
    spec = row.spec if isinstance(row.spec, dict) else {}
    try:
        stored_rule(spec)
        problem = ""
    except PolicyError as error:
        problem = str(error).removeprefix("rules[0] ")
    decision = spec.get("decision", "")
    return {
        "number": number,
        "row": row,
        "decision": decision,
        "who": who_text(spec),
        "tools": ", ".join(map(str, spec.get("tools", []))),
        "implied_tools": implied_tools(spec),
        "commands": shortened([command_line(entry) for entry in spec.get("commands", [])]),
        "paths": shortened([str(entry) for entry in spec.get("paths", [])]),
        "approver": dict(APPROVER_CHOICES).get(spec.get("approver", "staff"), "") if decision == "ask" else "",
        "recommended_changed": row.recommended and recommended.get(row.rule_id) != spec,
        "problem": problem,
        "description": spec.get("description", ""),
    }


# --- the pages --------------------------------------------------------------------------------------------------


@admin.register(PolicyRule)
class PolicyRuleAdmin(admin.ModelAdmin):
    form = RuleForm
    actions = None  # the page has no bulk actions: every change goes through policy_change
    change_form_template = "admin/mcpserver/policy/change_form.html"
    delete_confirmation_template = "admin/mcpserver/policy/delete_confirmation.html"

    def get_fieldsets(self, request: HttpRequest, obj: PolicyRule | None = None) -> Any:
        first = ["rule_id", "decision", "description", "enabled"] + (["position"] if obj is None else [])
        return [
            (None, {"fields": first}),
            (
                "Who it is for",
                {
                    "fields": ["users", "credentials", "clients", "scopes"],
                    "description": "Each field filled in must match the caller; all empty: anyone.",
                },
            ),
            ("What it is about", {"fields": ["tools", "commands", "paths"]}),
            ("Who may approve", {"fields": ["approver"]}),
        ]

    def save_model(self, request: HttpRequest, obj: PolicyRule, form: Any, change: bool) -> None:
        after = rule_entry(obj)
        if change and form.before == after:
            return  # saved as it was: no new version, nothing to record
        obj.updated_at, obj.updated_by = timezone.now(), request.user.get_username()
        with policy_change(request, "edited" if change else "added") as detail:
            if not change:
                rows = ordered_rules()
                at = form.cleaned_data.get("position")
                rows.insert(len(rows) if at is None else min(at - 1, len(rows)), obj)
                renumber(rows)
            obj.save()
            detail.update(rule_id=obj.rule_id, before=form.before, after=after)

    def delete_model(self, request: HttpRequest, obj: PolicyRule) -> None:
        with policy_change(request, "deleted") as detail:
            detail.update(rule_id=obj.rule_id, before=rule_entry(obj), after=None)
            super().delete_model(request, obj)

    def get_urls(self) -> list[URLPattern]:
        prefix = f"{self.opts.app_label}_{self.opts.model_name}"
        own = [
            path("<int:pk>/move/", self.admin_site.admin_view(self.move_view), name=f"{prefix}_move"),
            path("<int:pk>/enabled/", self.admin_site.admin_view(self.enabled_view), name=f"{prefix}_enabled"),
            path("settings/", self.admin_site.admin_view(self.settings_view), name=f"{prefix}_settings"),
            path("recommended/", self.admin_site.admin_view(self.recommended_view), name=f"{prefix}_recommended"),
            path("export/", self.admin_site.admin_view(self.export_view), name=f"{prefix}_export"),
        ]
        return own + super().get_urls()  # before the stock `<object_id>/` patterns

    # --- the list ----------------------------------------------------------------------------------------------

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied
        settings_row = PolicySettings.objects.filter(pk=1).first() or PolicySettings()
        rows = ordered_rules()
        recommended = recommended_specs()
        present = {row.rule_id for row in rows if row.recommended}
        loaded = load_policy()
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": "Command policy",
            "is_nav_sidebar_enabled": False,  # the rules' table needs the page's width
            "rules": [row_view(number, row, recommended) for number, row in enumerate(rows, 1)],
            "settings": settings_row,
            "settings_form": SettingsForm(initial={"default": settings_row.default, "opaque": settings_row.opaque}),
            "opaque_now": loaded.policy.opaque_decision,
            "broken": loaded.broken,
            "recommended_missing": [rule_id for rule_id in recommended if rule_id not in present],
            "recommended_present": len(present),
            "can_add": self.has_add_permission(request),
            "can_change": self.has_change_permission(request),
            "can_delete": self.has_delete_permission(request),
            **(extra_context or {}),
        }
        return TemplateResponse(request, "admin/mcpserver/policy/rules.html", context)

    def list_url(self, row: PolicyRule | None = None) -> str:
        url = reverse(f"admin:{self.opts.app_label}_{self.opts.model_name}_changelist")
        return url + (f"#rule-{row.pk}" if row is not None else "")

    # --- the actions: POST, then a redirect to the list ---------------------------------------------------------

    def _post_only(self, request: HttpRequest, allowed: bool) -> HttpResponse | None:
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not allowed:
            raise PermissionDenied
        return None

    def move_view(self, request: HttpRequest, pk: int) -> HttpResponse:
        refused = self._post_only(request, self.has_change_permission(request))
        if refused is not None:
            return refused
        direction = request.POST.get("direction", "")
        if direction not in ACTIONS_BY_DIRECTION:
            return HttpResponseBadRequest("direction must be up or down")
        try:
            with policy_change(request, ACTIONS_BY_DIRECTION[direction]) as detail:
                rows = ordered_rules()
                index = next((at for at, row in enumerate(rows) if row.pk == pk), None)
                if index is None:
                    raise Http404("No such rule.")
                row, to = rows[index], index - 1 if direction == "up" else index + 1
                if not 0 <= to < len(rows):
                    raise Unchanged(f"Rule “{row.rule_id}” is {'first' if direction == 'up' else 'last'} already.")
                rows[index], rows[to] = rows[to], rows[index]
                renumber(rows)
                detail.update(rule_id=row.rule_id, before={"number": index + 1}, after={"number": to + 1})
        except Unchanged as nothing:
            self.message_user(request, str(nothing), messages.INFO)
            return HttpResponseRedirect(self.list_url(row))
        self.message_user(request, f"Moved rule “{row.rule_id}” {direction} to place {to + 1}.", messages.SUCCESS)
        return HttpResponseRedirect(self.list_url(row))

    def enabled_view(self, request: HttpRequest, pk: int) -> HttpResponse:
        refused = self._post_only(request, self.has_change_permission(request))
        if refused is not None:
            return refused
        if request.POST.get("enabled") not in ("on", "off"):
            return HttpResponseBadRequest("enabled must be on or off")
        enable = request.POST.get("enabled") == "on"
        word = "enabled" if enable else "disabled"
        try:
            with policy_change(request, word) as detail:
                row = PolicyRule.objects.filter(pk=pk).first()
                if row is None:
                    raise Http404("No such rule.")
                if row.enabled == enable:
                    raise Unchanged(f"Rule “{row.rule_id}” was {word} already.")
                before = rule_entry(row)
                row.enabled, row.updated_at, row.updated_by = enable, timezone.now(), request.user.get_username()
                row.save(update_fields=["enabled", "updated_at", "updated_by"])
                detail.update(rule_id=row.rule_id, before=before, after=rule_entry(row))
        except Unchanged as nothing:
            self.message_user(request, str(nothing), messages.INFO)
            return HttpResponseRedirect(self.list_url(row))
        self.message_user(request, f"Rule “{row.rule_id}” {word}.", messages.SUCCESS)
        return HttpResponseRedirect(self.list_url(row))

    def settings_view(self, request: HttpRequest) -> HttpResponse:
        refused = self._post_only(request, self.has_change_permission(request))
        if refused is not None:
            return refused
        form = SettingsForm(request.POST)
        if not form.is_valid():
            self.message_user(request, "The settings were not changed: choose from the lists.", messages.ERROR)
            return HttpResponseRedirect(self.list_url())
        try:
            with policy_change(request, "settings") as detail:
                row = PolicySettings.objects.get(pk=1)  # bump_version made it
                before = {"default": row.default, "opaque": row.opaque or None}
                after = {"default": form.cleaned_data["default"], "opaque": form.cleaned_data["opaque"] or None}
                if before == after:
                    raise Unchanged("The settings were so already.")
                row.default, row.opaque = after["default"], after["opaque"] or ""
                row.save(update_fields=["default", "opaque"])
                detail.update(before=before, after=after)
        except Unchanged as nothing:
            self.message_user(request, str(nothing), messages.INFO)
            return HttpResponseRedirect(self.list_url())
        self.message_user(request, "Policy settings saved.", messages.SUCCESS)
        return HttpResponseRedirect(self.list_url())

    def recommended_view(self, request: HttpRequest) -> HttpResponse:
        switch = request.POST.get("switch")
        refused = self._post_only(
            request, self.has_delete_permission(request) if switch == "off" else self.has_add_permission(request)
        )
        if refused is not None:
            return refused
        if switch not in ("on", "off"):
            return HttpResponseBadRequest("switch must be on or off")
        try:
            if switch == "on":
                self.switch_on_recommended(request)
            else:
                self.switch_off_recommended(request)
        except Unchanged as nothing:
            self.message_user(request, str(nothing), messages.WARNING)
        return HttpResponseRedirect(self.list_url())

    def switch_on_recommended(self, request: HttpRequest) -> None:
        """The recommended rules not yet here go first, in their order; an id a rule of the admin's own holds is
        reported and left alone."""
        now, by = timezone.now(), request.user.get_username()
        with policy_change(request, "recommended_on") as detail:
            rows = ordered_rules()
            by_id = {row.rule_id: row for row in rows}
            taken = [spec["id"] for spec in RECOMMENDED if spec["id"] in by_id and not by_id[spec["id"]].recommended]
            added = [
                PolicyRule(rule_id=rule_id, spec=spec, recommended=True, position=0, updated_at=now, updated_by=by)
                for rule_id, spec in recommended_specs().items()
                if rule_id not in by_id
            ]
            if not added:
                raise Unchanged(taken_message(taken) if taken else "The recommended rules are all switched on already.")
            renumber(added + rows)
            PolicyRule.objects.bulk_create(added)
            detail.update(
                rule_ids=[row.rule_id for row in added], before=None, after=[rule_entry(row) for row in added]
            )
            if taken:
                detail["not_added"] = taken
        names = ", ".join(row.rule_id for row in added)
        self.message_user(
            request, f"Switched on {counted(len(added), 'recommended rule')}, at the top: {names}.", messages.SUCCESS
        )
        if taken:
            self.message_user(request, taken_message(taken), messages.WARNING)

    def switch_off_recommended(self, request: HttpRequest) -> None:
        with policy_change(request, "recommended_off") as detail:
            rows = list(PolicyRule.objects.filter(recommended=True).order_by("position", "id"))
            if not rows:
                raise Unchanged("No rule of the recommended set is here.")
            PolicyRule.objects.filter(pk__in=[row.pk for row in rows]).delete()
            detail.update(rule_ids=[row.rule_id for row in rows], before=[rule_entry(row) for row in rows], after=None)
        message = f"Switched off the recommended set: removed {counted(len(rows), 'rule')}."
        self.message_user(request, message, messages.SUCCESS)

    def export_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied
        response = HttpResponse(document_text(policy_document()), content_type="application/json; charset=utf-8")
        response["Content-Disposition"] = 'attachment; filename="sandstorm-policy.json"'
        return response


def counted(number: int, what: str) -> str:
    return f"{number} {what}{'' if number == 1 else 's'}"


def taken_message(taken: list[str]) -> str:
    return (
        f"Not added: {', '.join(taken)}: a rule of your own has {'that id' if len(taken) == 1 else 'these ids'}. "
        "Rename or delete it to add the recommended one."
    )
