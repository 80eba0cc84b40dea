"""The command policy page's forms: a rule as an admin writes it (one pattern or glob per line, `PATTERN
when:outside-repos` for a condition), checked by the engine's own reader before it is saved, its error shown on the
field it is about; and the policy's default and opaque decisions."""

from __future__ import annotations

import re
from typing import Any

from django import forms

from mcpserver.models import DECISION_CHOICES, PolicyRule
from mcpserver.policy.patterns import CONDITIONS
from mcpserver.policy.rules import SCOPES, PolicyError
from mcpserver.policy_source import rule_entry, stored_rule
from oauth.models import SCOPE_ALL, SCOPE_READ

WHEN = "when:"  # a command line `PATTERN when:outside-repos` carries a condition
SCOPE_LABELS = {SCOPE_ALL: f"{SCOPE_ALL} (every tool)", SCOPE_READ: f"{SCOPE_READ} (the read-only tools)"}
APPROVER_CHOICES = [("staff", "staff"), ("user", "staff, or the client's own user")]
OPAQUE_CHOICES = [("", "automatic (ask if any rule asks, else the default)"), *DECISION_CHOICES]
# rules[0] ('id'): commands[1]: … — the field a PolicyError is about, and the entry of a list field.
ERROR_PLACE = re.compile(r"(?P<field>[a-z]+)(?:\.(?P<sub>[a-z]+))?(?:\[(?P<index>\d+)\])?: (?P<message>.*)", re.S)


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


def entries_field(rows: int, help_text: str) -> forms.CharField:
    """A list the admin writes one entry per line (or comma-separated), in a monospaced box."""
    return forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": rows, "class": "vLargeTextField policy-mono"}),
        help_text=help_text,
    )


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
    users = entries_field(2, "Usernames, separated by commas or line breaks.")
    credentials = entries_field(2, "Credential names: bearer token names and connected apps' names.")
    clients = entries_field(2, "OAuth client ids of connected apps.")
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
    commands = entries_field(
        4,
        f"One pattern per line (see “How patterns read” below). A line ending in {WHEN}"
        + f" or {WHEN}".join(CONDITIONS)
        + " applies only then.",
    )
    paths = entries_field(3, "One path glob per line, over the paths the file and git tools name.")
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
