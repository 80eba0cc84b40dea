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

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django import forms
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
from mcpserver.models import DECISION_CHOICES, PolicyRule, PolicySettings
from mcpserver.policy.patterns import CONDITIONS
from mcpserver.policy.recommended import RECOMMENDED
from mcpserver.policy.rules import SCOPES, PolicyError
from mcpserver.policy_source import (
    bump_version,
    document_text,
    load_policy,
    policy_document,
    policy_version,
    stored_rule,
)
from mcpserver.process import INSTANCE_ID
from oauth.models import SCOPE_ALL, SCOPE_READ

WHEN = "when:"  # a command line `PATTERN when:outside-repos` carries a condition
SHOWN = 3  # patterns or globs shown in a row before "and N more"
SHOWN_CHARS = 60
SCOPE_LABELS = {SCOPE_ALL: f"{SCOPE_ALL} (every tool)", SCOPE_READ: f"{SCOPE_READ} (the read-only tools)"}
APPROVER_CHOICES = [("staff", "staff"), ("user", "staff, or the client's own user")]
OPAQUE_CHOICES = [("", "automatic (ask if any rule asks, else the default)"), *DECISION_CHOICES]
ACTIONS_BY_DIRECTION = {"up": "moved_up", "down": "moved_down"}
# rules[0] ('id'): commands[1]: … — the field a PolicyError is about, and the entry of a list field.
ERROR_PLACE = re.compile(r"(?P<field>[a-z]+)(?:\.(?P<sub>[a-z]+))?(?:\[(?P<index>\d+)\])?: (?P<message>.*)", re.S)


def rule_entry(row: PolicyRule) -> dict[str, Any]:
    """A stored rule as policy documents and audit records show it (a disabled one says so)."""
    return row.spec if row.enabled else {**row.spec, "enabled": False}


# --- the rule form ------------------------------------------------------------------------------------------------


def split_entries(text: str) -> list[str]:
    """Entries separated by commas or line breaks, blanks dropped."""
    return [entry.strip() for entry in re.split(r"[,\n]", text) if entry.strip()]


def numbered_lines(text: str) -> list[tuple[int, str]]:
    """The non-blank lines of `text`, each with its line number (for errors that name an entry)."""
    return [(number, line.strip()) for number, line in enumerate(text.splitlines(), 1) if line.strip()]


def command_entry(line: str) -> str | dict[str, str]:
    """`PATTERN when:CONDITION` as a rule's command entry; any other line is the pattern itself."""
    words = line.rsplit(maxsplit=1)
    if len(words) == 2 and words[1].startswith(WHEN):
        return {"pattern": words[0], "when": words[1][len(WHEN) :]}
    return line


def command_line(entry: object) -> str:
    if isinstance(entry, dict):
        return f"{entry.get('pattern', '')} {WHEN}{entry.get('when', '')}"
    return str(entry)


class RuleForm(forms.ModelForm):
    decision = forms.ChoiceField(
        choices=DECISION_CHOICES,
        widget=forms.RadioSelect(attrs={"class": "radiolist inline"}),
        help_text="allow: run it. ask: hold it until someone approves. deny: refuse it.",
    )
    description = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 2, "class": "vLargeTextField"}),
        help_text="Why the rule exists, for whoever reads it later.",
    )
    position = forms.IntegerField(
        required=False, min_value=1, help_text="Its place in the order: 1 is first. Empty: after the last rule."
    )
    users = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 2, "class": "vLargeTextField policy-mono"}),
        help_text="Usernames, separated by commas or line breaks.",
    )
    credentials = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 2, "class": "vLargeTextField policy-mono"}),
        help_text="Credential names: bearer token names and connected apps' names.",
    )
    clients = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 2, "class": "vLargeTextField policy-mono"}),
        help_text="OAuth client ids of connected apps.",
    )
    scopes = forms.MultipleChoiceField(
        required=False,
        choices=[(scope, SCOPE_LABELS.get(scope, scope)) for scope in SCOPES],
        widget=forms.CheckboxSelectMultiple,
        help_text="Credentials holding any of the checked scopes.",
    )
    tools = forms.CharField(
        required=False,
        widget=forms.TextInput(attrs={"class": "vLargeTextField policy-mono"}),
        help_text="Tool name globs, separated by commas (terminal_*, file_write). Empty: the tools its commands "
        "and paths apply to, or every tool if it has neither.",
    )
    commands = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 4, "class": "vLargeTextField policy-mono"}),
        help_text=f"One pattern per line (see “How patterns read” below). A line ending in {WHEN}"
        + f" or {WHEN}".join(CONDITIONS)
        + " applies only then.",
    )
    paths = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 3, "class": "vLargeTextField policy-mono"}),
        help_text="One path glob per line, over the paths the file and git tools name.",
    )
    approver = forms.ChoiceField(
        choices=APPROVER_CHOICES,
        initial="staff",
        required=False,  # left out: staff
        widget=forms.RadioSelect(attrs={"class": "radiolist"}),
        help_text="Who may answer an ask rule's question. Only for ask rules.",
    )

    class Meta:
        model = PolicyRule
        fields = ["rule_id", "enabled"]
        labels = {"rule_id": "Id"}
        help_texts = {
            "rule_id": "Up to 64 letters, digits or _.:- ; the audit log names the rule by it.",
            "enabled": "A disabled rule is kept but decides nothing.",
        }
        error_messages = {"rule_id": {"unique": "Another rule has this id."}}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.spec: dict[str, Any] = {}
        self.before = rule_entry(self.instance) if self.instance.pk else None
        if self.instance.pk:
            del self.fields["position"]  # an existing rule moves with Move up and Move down
            if not self.is_bound:
                self.initial.update(self.initial_from_spec(self.instance.spec))

    @staticmethod
    def initial_from_spec(spec: object) -> dict[str, Any]:
        if not isinstance(spec, dict):
            return {}  # a stored spec that is not a rule: the form starts empty, to write it anew
        who = spec["who"] if isinstance(spec.get("who"), dict) else {}
        return {
            "decision": spec.get("decision"),
            "description": spec.get("description", ""),
            **{key: "\n".join(who.get(key, [])) for key in ("users", "credentials", "clients")},
            "scopes": who.get("scopes", []),
            "tools": ", ".join(spec.get("tools", [])),
            "commands": "\n".join(command_line(entry) for entry in spec.get("commands", [])),
            "paths": "\n".join(spec.get("paths", [])),
            "approver": spec.get("approver", "staff"),
        }

    def clean(self) -> dict[str, Any]:
        cleaned: dict[str, Any] = super().clean() or {}
        if self.errors:
            return cleaned  # the rule is checked once its fields read
        commands = numbered_lines(cleaned.get("commands", ""))
        paths = numbered_lines(cleaned.get("paths", ""))
        spec: dict[str, Any] = {"id": cleaned["rule_id"], "decision": cleaned["decision"]}
        who = {key: split_entries(cleaned.get(key, "")) for key in ("users", "credentials", "clients")}
        who = {key: value for key, value in who.items() if value}
        if cleaned.get("scopes"):
            who["scopes"] = list(cleaned["scopes"])
        if who:
            spec["who"] = who
        for key, value in (
            ("tools", split_entries(cleaned.get("tools", ""))),
            ("commands", [command_entry(line) for _, line in commands]),
            ("paths", [line for _, line in paths]),
        ):
            if value:
                spec[key] = value
        if cleaned.get("description", "").strip():
            spec["description"] = cleaned["description"].strip()
        if cleaned.get("approver") not in ("", None, "staff"):
            spec["approver"] = cleaned["approver"]
        try:
            self.spec = stored_rule(spec).to_dict()
        except PolicyError as error:
            lines = {"commands": [number for number, _ in commands], "paths": [number for number, _ in paths]}
            self.place_error(str(error), spec["id"], lines)
        return cleaned

    def place_error(self, text: str, rule_id: str, lines: dict[str, list[int]]) -> None:
        """Show a PolicyError on the field it names (`commands[1]: …` as "line 2: …" of the commands)."""
        text = text.removeprefix(f"rules[0] ({rule_id!r}): ")
        place = ERROR_PLACE.fullmatch(text)
        if place is None:
            self.add_error(None, text)
            return
        name = place["sub"] if place["field"] == "who" and place["sub"] else place["field"]
        name = "rule_id" if name == "id" else name
        if name not in self.fields:
            self.add_error(None, text)
            return
        message, index = place["message"], place["index"]
        if index is not None and name in lines and int(index) < len(lines[name]):
            message = f"line {lines[name][int(index)]}: {message}"
        self.add_error(name, message)

    def save(self, commit: bool = True) -> PolicyRule:
        self.instance.spec = self.spec
        return super().save(commit)


class SettingsForm(forms.Form):
    default = forms.ChoiceField(choices=DECISION_CHOICES, label="What no rule decides")
    opaque = forms.ChoiceField(choices=OPAQUE_CHOICES, required=False, label="A command the parser cannot see through")


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
