"""The console's form for a new bearer token, and the one that renames a token.

A new token acts, by default, as the admin who makes it and gets the read-only scope (widening is a choice, not an
accident); its expiry is a preset (7, 30 or 90 days, never) or a date of one's own, never in the past. Names are
unique among unrevoked tokens: the form says which token holds a name (oauth.tokens.name_holder). A full-scope
token's confinement profile (oauth.confinement) is chosen here and changed on its page; a read-only token has none.
"""

from __future__ import annotations

from datetime import datetime, time, timedelta
from typing import Any

from django import forms
from django.utils import timezone
from django.utils.html import format_html

from oauth.agent_identity import agent_os_user
from oauth.confinement import form_choices
from oauth.models import CONFINEMENT_INSTALLATION, SCOPE_ALL, SCOPE_READ, SCOPE_WORDS, BearerToken
from oauth.tokens import name_holder, name_taken_message

EXPIRY_NEVER = "never"
EXPIRY_CUSTOM = "custom"
EXPIRY_PRESETS = {"7": 7, "30": 30, "90": 90}
EXPIRY_CHOICES = [
    ("7", "in 7 days"),
    ("30", "in 30 days"),
    ("90", "in 90 days"),
    (EXPIRY_NEVER, "never"),
    (EXPIRY_CUSTOM, "on the date below"),
]
DEFAULT_EXPIRY = "30"


def scope_choices() -> list[tuple[str, str]]:
    return [
        (SCOPE_READ, format_html("<code>{}</code> — {}", SCOPE_READ, SCOPE_WORDS[SCOPE_READ])),
        (SCOPE_ALL, format_html("<code>{}</code> — {}", SCOPE_ALL, SCOPE_WORDS[SCOPE_ALL])),
    ]


READ_ONLY_CONFINED = (
    "A read-only token has no confinement profile: its calls always run in the read sandbox. Leave this at the "
    "installation's default, or give the token the full scope."
)


def radios() -> forms.RadioSelect:
    # The admin's style for a list of radios (its own radio_fields get it): labels as wide as the form, not 160 px.
    return forms.RadioSelect(attrs={"class": "radiolist"})


def confinement_choices() -> list[tuple[str, str]]:
    return form_choices(agent_os_user())


def confinement_field() -> forms.ChoiceField:
    return forms.ChoiceField(
        choices=confinement_choices,
        widget=radios(),
        initial=CONFINEMENT_INSTALLATION,
        required=False,
        label="Confinement",
        help_text="What the agent's commands may reach, for the full scope (read-only calls always run in the read "
        "sandbox). Choose host only for an agent that must administer this machine.",
    )


class UniqueActiveName:
    """The name check shared by both forms: no other unrevoked token may hold the name."""

    def check_name(self, name: str, exclude_pk: int | None) -> str:
        holder = name_holder(name, exclude_pk=exclude_pk)
        if holder is not None:
            raise forms.ValidationError(name_taken_message(holder), code="name_taken")
        return name


class NewTokenForm(UniqueActiveName, forms.ModelForm):
    scope = forms.ChoiceField(
        choices=scope_choices, widget=radios(), initial=SCOPE_READ, help_text="What the agent may do."
    )
    expiry = forms.ChoiceField(choices=EXPIRY_CHOICES, widget=radios(), initial=DEFAULT_EXPIRY, label="Expires")
    confinement = confinement_field()
    expires_on = forms.DateField(
        required=False,
        label="Expiry date",
        widget=forms.DateInput(attrs={"type": "date"}),
        help_text="With “on the date below”: the token stops working at the end of this day (server time).",
    )

    class Meta:
        model = BearerToken
        fields = ["name", "user", "scope", "confinement"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["user"].help_text = "Who the agent acts as: its calls are recorded under this user."

    def clean_name(self) -> str:
        return self.check_name(self.cleaned_data["name"], None)

    def clean(self) -> dict[str, Any]:
        cleaned: dict[str, Any] = super().clean() or {}
        if cleaned.get("confinement") and cleaned.get("scope") != SCOPE_ALL:
            self.add_error("confinement", READ_ONLY_CONFINED)
        choice = cleaned.get("expiry")
        if choice == EXPIRY_CUSTOM:
            day = cleaned.get("expires_on")
            if day is None:
                self.add_error("expires_on", "Give the date the token expires on, or choose a preset.")
            else:
                end = timezone.make_aware(datetime.combine(day, time.max))
                if end <= timezone.now():
                    self.add_error("expires_on", "This date is in the past: the token would never work.")
                else:
                    cleaned["expires_at"] = end
        elif choice in EXPIRY_PRESETS:
            cleaned["expires_at"] = timezone.now() + timedelta(days=EXPIRY_PRESETS[choice])
        else:
            cleaned["expires_at"] = None
        return cleaned

    def save(self, commit: bool = True) -> BearerToken:
        token: BearerToken = super().save(commit=False)
        token.expires_at = self.cleaned_data.get("expires_at")
        if commit:
            token.save()
        return token


class RenameTokenForm(UniqueActiveName, forms.ModelForm):
    """A token's page edits its name and (full scope only) its confinement profile: owner, scope and expiry are what
    the secret was given for. The admin saves the profile through oauth.confinement, which records the change."""

    confinement = confinement_field()

    class Meta:
        model = BearerToken
        fields = ["name", "confinement"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if SCOPE_ALL not in self.instance.scopes:
            del self.fields["confinement"]  # a declared field outlives the admin's `fields`: read-only has no profile

    def clean_name(self) -> str:
        return self.check_name(self.cleaned_data["name"], self.instance.pk)
