"""Anonymous client registration (/oauth/register/) stores bounded metadata: a body of at most the client metadata
document cap (16 KiB, 413 above it; 400 if nested too deep to parse), so many redirect URIs of so many characters,
and none of the fields we do not use — not in the client, the audit log or the answer. In-process, with the test
client."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client
from oauth2_provider.models import Application
from oauth2_provider.settings import oauth2_settings

from audit.models import AuditRecord
from oauth.views.registration import MAX_REDIRECT_URI_LENGTH, MAX_REDIRECT_URIS

pytestmark = pytest.mark.django_db

CALLBACK = "https://claude.ai/api/mcp/auth_callback"


def register(metadata: dict[str, Any] | bytes, **extra: Any) -> Any:
    body = metadata if isinstance(metadata, bytes) else json.dumps(metadata).encode()
    return Client().post("/oauth/register/", body, content_type="application/json", **extra)


def test_the_registration_body_shares_the_metadata_document_cap_of_16_kib() -> None:
    assert oauth2_settings.CIMD_MAX_DOCUMENT_SIZE == 16 * 1024


def test_a_body_over_16_kib_gets_413_and_registers_nothing() -> None:
    padded = {"redirect_uris": [CALLBACK], "client_name": "big", "padding": "x" * (16 * 1024)}
    response = register(padded)
    assert response.status_code == 413
    assert response.json()["error"] == "invalid_client_metadata"
    assert not Application.objects.exists()


def test_a_megabyte_of_unknown_fields_gets_413() -> None:
    flood = {"redirect_uris": [CALLBACK], **{f"x-field-{number}": "y" * 1000 for number in range(1000)}}
    assert register(flood).status_code == 413
    assert not Application.objects.exists() and not AuditRecord.objects.filter(event="oauth.client_registered").exists()


def test_a_body_declared_over_the_cap_is_refused_before_it_is_read() -> None:
    response = register({"redirect_uris": [CALLBACK]}, CONTENT_LENGTH=str(10 * 1024 * 1024))
    assert response.status_code == 413


def test_a_deeply_nested_registration_body_gets_400_not_500() -> None:
    depth = 8000  # beyond Python's recursion limit, inside the registration body's 16 KiB cap
    response = register(b"[" * depth + b"]" * depth)
    assert response.status_code == 400 and response.json()["error"] == "invalid_client_metadata"


def test_too_many_redirect_uris_are_refused_as_invalid_redirect_uri() -> None:
    uris = [f"https://claude.ai/cb/{number}" for number in range(MAX_REDIRECT_URIS + 1)]
    response = register({"redirect_uris": uris})
    assert response.status_code == 400 and response.json()["error"] == "invalid_redirect_uri"
    assert str(MAX_REDIRECT_URIS) in response.json()["error_description"]
    assert not Application.objects.exists()


def test_the_most_redirect_uris_allowed_register() -> None:
    uris = [f"https://claude.ai/cb/{number}" for number in range(MAX_REDIRECT_URIS)]
    assert register({"redirect_uris": uris}).status_code == 201


def test_an_overlong_redirect_uri_is_refused() -> None:
    response = register({"redirect_uris": ["https://claude.ai/" + "a" * MAX_REDIRECT_URI_LENGTH]})
    assert response.status_code == 400 and response.json()["error"] == "invalid_redirect_uri"


@pytest.mark.parametrize("name", ["n" * 256, {"nested": "object"}, 42])
def test_a_client_name_the_client_cannot_hold_is_invalid_client_metadata(name: object) -> None:
    response = register({"redirect_uris": [CALLBACK], "client_name": name})
    assert response.status_code == 400 and response.json()["error"] == "invalid_client_metadata"


def test_unknown_fields_are_dropped_from_the_client_the_audit_log_and_the_answer() -> None:
    marker = "unknown-field-marker-7f3a"
    response = register(
        {"redirect_uris": [CALLBACK], "client_name": "Claude", "x_extra": marker * 100, "logo_uri": marker}
    )
    assert response.status_code == 201
    assert marker not in response.content.decode()
    application = Application.objects.get(client_id=response.json()["client_id"])
    assert marker not in json.dumps(
        {field.name: str(getattr(application, field.attname)) for field in Application._meta.concrete_fields}
    )
    (record,) = AuditRecord.objects.filter(event="oauth.client_registered")
    assert marker not in json.dumps(record.detail)
    assert record.detail is not None and record.detail["redirect_uris"] == [CALLBACK]
