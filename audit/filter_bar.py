"""The filter bar above the call list: links and plain GET forms (no script) that set the parameters of
audit.filters, so every view is a URL. One click on a link changes one thing and keeps the rest: a date range, an
outcome or an exit code toggled in or out, a quick view ("failed yesterday"); the tool, credential and user menus
are forms of checkboxes, for several at once; the custom from–to is a form of two date inputs, another exit code a
form of one number.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from django.utils.http import urlencode
from django.utils.text import Truncator

from audit.filters import (
    DATE_FILTERS,
    EXIT_CODE_NONZERO,
    FILTER_PARAMS,
    OUTCOME_FAILED,
    OUTCOME_VALUES,
    RANGES,
    SEARCH_PARAM,
)

PAGE_PARAM = "p"
OPTION_LABEL_CHARS = 48
# The quick views: one click for the question the list is most often asked.
QUICK_VIEWS = (("Failed today", "today"), ("Failed yesterday", "yesterday"), ("Failed, past 7 days", "7d"))
KIND_LABELS = {"bearer": "admin-issued token", "oauth": "OAuth client"}
# The exit codes offered as links, with what they usually mean (a program may use them otherwise); the form beside
# them takes any other.
EXIT_CODES = {
    "0": "success",
    EXIT_CODE_NONZERO: "every exit code but 0",
    "1": "general error",
    "2": "usage error (for many programs)",
    "124": "timed out (the server stopped it)",
    "126": "found but not executable",
    "127": "command not found",
    "130": "interrupted (SIGINT)",
    "137": "killed (SIGKILL)",
    "143": "terminated (SIGTERM)",
}


@dataclass(frozen=True)
class Link:
    label: str
    url: str
    active: bool = False
    title: str = ""


@dataclass(frozen=True)
class Option:
    value: str
    label: str
    checked: bool


@dataclass(frozen=True)
class Menu:
    """A dropdown of checkboxes for one parameter, submitted with the other parameters as hidden inputs."""

    name: str
    title: str
    summary: str
    options: list[Option]
    hidden: list[tuple[str, str]]
    active: bool


@dataclass(frozen=True)
class FilterBar:
    ranges: list[Link]
    outcomes: list[Link]
    quick: list[Link]
    menus: list[Menu]
    since: str
    until: str
    dates_hidden: list[tuple[str, str]]
    exit_codes: list[Link] = field(default_factory=list)
    exit_code_hidden: list[tuple[str, str]] = field(default_factory=list)
    active: list[Link] = field(default_factory=list)
    clear_url: str = ""


def query(params: dict[str, list[str]], **changes: Sequence[str] | None) -> str:
    """`?...` of `params` with each named parameter set to the values given (None or empty: removed), page reset."""
    merged = {name: list(values) for name, values in params.items() if name != PAGE_PARAM}
    for name, values in changes.items():
        merged.pop(name, None)
        if values:
            merged[name] = list(values)
    return "?" + urlencode([(name, value) for name, values in merged.items() for value in values]) if merged else "?"


def hidden_inputs(params: dict[str, list[str]], leave_out: Iterable[str]) -> list[tuple[str, str]]:
    left_out = {*leave_out, PAGE_PARAM}
    return [(name, value) for name, values in params.items() if name not in left_out for value in values]


def _given(params: dict[str, list[str]], name: str) -> list[str]:
    return [value for value in params.get(name, []) if value.strip()]


def toggled(values: list[str], value: str) -> list[str]:
    return [other for other in values if other != value] if value in values else [*values, value]


def range_links(params: dict[str, list[str]]) -> list[Link]:
    no_dates = dict.fromkeys(DATE_FILTERS)
    chosen = _given(params, "range")
    dated = any(_given(params, name) for name in DATE_FILTERS)
    links = [Link("Any time", query(params, **no_dates), not dated)]
    for key, (label, _, _) in RANGES.items():
        links.append(Link(label, query(params, **{**no_dates, "range": [key]}), chosen == [key]))
    return links


def outcome_links(params: dict[str, list[str]]) -> list[Link]:
    chosen = _given(params, "outcome")
    links = [Link("any", query(params, outcome=None), not chosen)]
    links += [Link(value, query(params, outcome=toggled(chosen, value)), value in chosen) for value in OUTCOME_VALUES]
    return links


def exit_code_links(params: dict[str, list[str]]) -> list[Link]:
    """Any, then each of EXIT_CODES toggled in or out, then the codes chosen that are not among them (to remove)."""
    chosen = _given(params, "exit_code")
    links = [Link("any", query(params, exit_code=None), not chosen)]
    offered = {**EXIT_CODES, **{value: "" for value in chosen if value not in EXIT_CODES}}
    for value, meaning in offered.items():
        links.append(Link(value, query(params, exit_code=toggled(chosen, value)), value in chosen, meaning))
    return links


def quick_links(params: dict[str, list[str]]) -> list[Link]:
    no_dates = dict.fromkeys(DATE_FILTERS)
    outcome = _given(params, "outcome")
    chosen_range = _given(params, "range")
    return [
        Link(
            label,
            query(params, **{**no_dates, "outcome": [OUTCOME_FAILED], "range": [key]}),
            outcome == [OUTCOME_FAILED] and chosen_range == [key],
        )
        for label, key in QUICK_VIEWS
    ]


def menu(params: dict[str, list[str]], name: str, title: str, choices: list[tuple[str, str]]) -> Menu:
    """Checkboxes for `choices` ((value, label)); a chosen value that is not among them is listed too, checked."""
    chosen = _given(params, name)
    known = dict(choices)
    options = [Option(value, label, value in chosen) for value, label in choices]
    options += [
        Option(value, Truncator(value).chars(OPTION_LABEL_CHARS), True) for value in chosen if value not in known
    ]
    labels = [known.get(value, value) for value in chosen]
    summary = "any" if not chosen else labels[0] if len(chosen) == 1 else f"{len(chosen)} chosen"
    return Menu(name, title, Truncator(summary).chars(32), options, hidden_inputs(params, [name]), bool(chosen))


def active_links(params: dict[str, list[str]]) -> list[Link]:
    """Each filter in use, as a link that removes it (the search too)."""
    links = []
    for name in (*FILTER_PARAMS, SEARCH_PARAM):
        for value in _given(params, name):
            label = f"{'search' if name == SEARCH_PARAM else name}: {Truncator(value).chars(OPTION_LABEL_CHARS)}"
            links.append(Link(label, query(params, **{name: [v for v in params[name] if v != value]})))
    return links


def filter_bar(
    params: dict[str, list[str]],
    tools: list[str],
    credentials: list[tuple[str, str]],
    users: list[str],
) -> FilterBar:
    """The bar for a list shown with `params`; the menus offer the recent `tools`, `credentials` ((kind:id, label))
    and `users`."""
    active = active_links(params)
    return FilterBar(
        ranges=range_links(params),
        outcomes=outcome_links(params),
        quick=quick_links(params),
        menus=[
            menu(params, "tool", "Tool", [(tool, tool) for tool in tools]),
            menu(params, "credential", "Credential", credentials),
            menu(params, "user", "User", [(user, user) for user in users]),
            menu(params, "credential_kind", "Kind", list(KIND_LABELS.items())),
        ],
        since=(_given(params, "since") or [""])[-1],
        until=(_given(params, "until") or [""])[-1],
        dates_hidden=hidden_inputs(params, DATE_FILTERS),
        exit_codes=exit_code_links(params),
        exit_code_hidden=hidden_inputs(params, []),  # the code typed is one more, beside those chosen
        active=active,
        clear_url=query({}) if active else "",
    )
