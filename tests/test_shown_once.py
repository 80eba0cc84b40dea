"""oauth.shown_once: a secret kept in the session for exactly one showing after a redirect."""

from __future__ import annotations

import pytest
from django.contrib.sessions.backends.signed_cookies import SessionStore
from django.http import HttpRequest

from oauth import shown_once


def request_with_session(session: SessionStore | None = None) -> HttpRequest:
    request = HttpRequest()
    request.session = session if session is not None else SessionStore()
    return request


def test_a_kept_payload_is_taken_once_then_gone() -> None:
    request = request_with_session()
    ticket = shown_once.keep(request, "rotation", {"secret": "sst_one"})
    assert shown_once.take(request, "rotation", ticket) == {"secret": "sst_one"}
    assert shown_once.take(request, "rotation", ticket) is None


def test_it_survives_the_session_being_saved_and_loaded_as_between_the_post_and_the_get() -> None:
    first = request_with_session()
    ticket = shown_once.keep(first, "rotation", {"secret": "sst_two", "counts": {"bearer_tokens": 3}})
    first.session.save()
    later = request_with_session(SessionStore(session_key=first.session.session_key))
    assert shown_once.take(later, "rotation", ticket) == {"secret": "sst_two", "counts": {"bearer_tokens": 3}}
    later.session.save()
    again = request_with_session(SessionStore(session_key=later.session.session_key))
    assert shown_once.take(again, "rotation", ticket) is None


def test_a_ticket_for_something_else_gives_nothing_and_leaves_it_for_its_own_page() -> None:
    request = request_with_session()
    ticket = shown_once.keep(request, "token", {"secret": "sst_three"})
    assert shown_once.take(request, "rotation", ticket) is None
    assert shown_once.take(request, "token", ticket) == {"secret": "sst_three"}


def test_an_unknown_ticket_gives_nothing() -> None:
    request = request_with_session()
    shown_once.keep(request, "rotation", {"secret": "sst_four"})
    assert shown_once.take(request, "rotation", "not-a-ticket") is None
    assert shown_once.take(request_with_session(), "rotation", "not-a-ticket") is None


def test_a_payload_kept_too_long_gives_nothing_and_is_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    now = 1_000_000.0
    monkeypatch.setattr(shown_once.time, "time", lambda: now)
    request = request_with_session()
    stale = shown_once.keep(request, "rotation", {"secret": "sst_old"})
    now += shown_once.KEEP_SECONDS + 1
    assert shown_once.take(request, "rotation", stale) is None
    assert stale not in request.session[shown_once.SESSION_KEY]

    left = shown_once.keep(request, "rotation", {"secret": "sst_left"})
    now += shown_once.KEEP_SECONDS + 1
    fresh = shown_once.keep(request, "rotation", {"secret": "sst_new"})  # keeping drops what expired meanwhile
    assert set(request.session[shown_once.SESSION_KEY]) == {fresh}
    assert shown_once.take(request, "rotation", left) is None


def test_each_keeping_gets_a_ticket_of_its_own() -> None:
    request = request_with_session()
    tickets = {shown_once.keep(request, "rotation", {"n": n}) for n in range(20)}
    assert len(tickets) == 20
    assert all(shown_once.take(request, "rotation", ticket) is not None for ticket in tickets)
