"""The OAuth policy that security depends on: every unsafe default of django-oauth-toolkit overridden, only the
endpoints we use mounted, and the pure policy functions (redirect URIs, registration metadata)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings
from django.urls import NoReverseMatch, reverse
from oauth2_provider.settings import oauth2_settings

from oauth.redirects import redirect_uri_refusal
from oauth.views.registration import metadata_refusal

REPO = Path(__file__).resolve().parent.parent

SECURITY_VALUES = {
    "OAUTH2_VALIDATOR_CLASS": "oauth.policy.SandstormValidator",
    "PKCE_REQUIRED": True,
    "COMPLIANT_BCP_RFC9700_PKCE_METHOD": True,  # no `plain`
    "COMPLIANT_BCP_RFC9700_PKCE_REQUIRED": True,
    "COMPLIANT_BCP_RFC9700_AUTHZ_RESPONSE_ISS": True,  # RFC 9207 `iss`
    "COMPLIANT_BCP_RFC9700_TOKEN_STORAGE": True,  # checksums, never tokens
    "COMPLIANT_BCP_RFC9700_IMPLICIT_GRANT": True,
    "COMPLIANT_BCP_RFC9700_PASSWORD_GRANT": True,
    "COMPLIANT_BCP_RFC9700_ACCESS_TOKEN_TRANSPORT": True,
    "COMPLIANT_BCP_RFC9700_REFRESH_TOKEN": True,
    "COMPLIANT_BCP_RFC9700_REDIRECT_URI_MATCHING": True,
    "REFRESH_TOKEN_REUSE_PROTECTION": True,
    "ROTATE_REFRESH_TOKEN": True,
    "REFRESH_TOKEN_GRACE_PERIOD_SECONDS": 0,
    "AUTHORIZATION_CODE_EXPIRE_SECONDS": 60,
    "ALLOW_URI_WILDCARDS": False,
    "ALLOW_LOCALHOST_LOOPBACK": True,  # Claude Code's http://localhost:<any port>/callback
    "REQUEST_APPROVAL_PROMPT": "force",
    "OIDC_ENABLED": False,
    "SCOPES": {"mcp": "every tool", "mcp:read": "read-only tools"},
    "DEFAULT_SCOPES": ["mcp"],
    "OAUTH2_RESPONSE_TYPES_SUPPORTED": ["code"],
    "OAUTH2_GRANT_TYPES_SUPPORTED": ["authorization_code", "refresh_token"],
    "DCR_ENABLED": True,
    "DCR_REGISTRATION_PERMISSION_CLASSES": ("oauth2_provider.dcr.AllowAllDCRPermission",),
    "CIMD_ENABLED": True,
    # The SSRF-hardened fetcher, through a wrapper that keeps why a fetch failed (asserted below).
    "CIMD_METADATA_FETCHER": "oauth.metadata_documents.ExplainingMetadataFetcher",
}


def test_client_metadata_documents_are_fetched_by_the_ssrf_hardened_fetcher() -> None:
    from oauth2_provider.cimd import SafeMetadataFetcher

    from oauth.metadata_documents import ExplainingMetadataFetcher

    assert oauth2_settings.CIMD_METADATA_FETCHER is ExplainingMetadataFetcher
    assert ExplainingMetadataFetcher.base is SafeMetadataFetcher


@pytest.mark.parametrize(("name", "value"), sorted(SECURITY_VALUES.items()))
def test_each_security_relevant_oauth_setting_is_set_on_purpose(name: str, value: object) -> None:
    assert settings.OAUTH2_PROVIDER[name] == value


def test_the_token_endpoint_accepts_public_and_secret_post_clients() -> None:
    methods = settings.OAUTH2_PROVIDER["OAUTH2_TOKEN_ENDPOINT_AUTH_METHODS_SUPPORTED"]
    assert isinstance(methods, list) and {"none", "client_secret_post"} <= set(methods)


def test_issuer_resource_and_lifetimes_come_from_the_environment_exactly(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDSTORM_")}
    env.update(
        SANDSTORM_STATE_DIR=str(tmp_path / "state"),
        SANDSTORM_WORKSPACE_ROOT=str(tmp_path / "ws"),
        SANDSTORM_PUBLIC_URL="https://mcp.example.com",
        SANDSTORM_ACCESS_TOKEN_TTL="900",
    )
    code = (
        "import json; from django.conf import settings; p = settings.OAUTH2_PROVIDER; "
        "print(json.dumps([p['OIDC_ISS_ENDPOINT'], p['OAUTH2_PROTECTED_RESOURCE_IDENTIFIER'], "
        "p['OAUTH2_PROTECTED_RESOURCE_AUTHORIZATION_SERVERS'], p['ACCESS_TOKEN_EXPIRE_SECONDS']]))"
    )
    result = subprocess.run(
        [sys.executable, "manage.py", "shell", "--no-imports", "-c", code],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    issuer, resource, servers, ttl = json.loads(result.stdout.strip().splitlines()[-1])
    assert issuer == "https://mcp.example.com"
    assert resource == "https://mcp.example.com/mcp"
    assert servers == ["https://mcp.example.com"]
    assert ttl == 900


def test_the_default_access_token_lifetime_is_one_hour() -> None:
    assert oauth2_settings.ACCESS_TOKEN_EXPIRE_SECONDS == settings.ACCESS_TOKEN_TTL
    if "SANDSTORM_ACCESS_TOKEN_TTL" not in os.environ:
        assert settings.ACCESS_TOKEN_TTL == 3600


@pytest.mark.parametrize(
    "name", ["authorize", "token", "revoke-token", "dcr-register", "oauth-server-metadata", "oauth-resource-metadata"]
)
def test_the_endpoints_we_use_are_mounted(name: str) -> None:
    reverse(f"oauth2_provider:{name}")


@pytest.mark.parametrize(
    "name",
    [
        "introspect",
        "device-authorization",
        "device",
        "list",
        "register",
        "detail",
        "authorized-token-list",
        "oidc-connect-discovery-info",
        "jwks-info",
        "user-info",
        "rp-initiated-logout",
    ],
)
def test_toolkit_endpoints_we_do_not_use_are_not_mounted(name: str) -> None:
    with pytest.raises(NoReverseMatch):
        reverse(f"oauth2_provider:{name}")


@pytest.mark.parametrize(
    "uri",
    [
        "https://claude.ai/api/mcp/auth_callback",
        "https://claude.com/api/mcp/auth_callback",
        "http://127.0.0.1:9/cb",
        "http://localhost/callback",
        "http://[::1]:5000/cb",
    ],
)
def test_https_and_loopback_redirect_uris_are_allowed(uri: str) -> None:
    assert redirect_uri_refusal(uri) is None


@pytest.mark.parametrize(
    "uri",
    [
        "http://claude.ai/api/mcp/auth_callback",
        "http://127.0.0.2/cb",
        "http://localhost.evil.example/cb",
        "https://u:p@claude.ai/cb",
        "https://claude.ai/cb#x",
        "custom-scheme://cb",
        "https:///nohost",
        "https://claude.ai:99999/cb",
    ],
)
def test_other_redirect_uris_are_refused(uri: str) -> None:
    assert redirect_uri_refusal(uri) is not None


def test_registration_metadata_defaults_are_acceptable() -> None:
    assert metadata_refusal({"redirect_uris": ["https://claude.ai/api/mcp/auth_callback"]}) is None


@pytest.mark.parametrize(
    "metadata",
    [
        {"grant_types": ["client_credentials"]},
        {"grant_types": "authorization_code"},
        {"response_types": ["code", "token"]},
        {"token_endpoint_auth_method": "tls_client_auth"},
        {"redirect_uris": []},
        {"redirect_uris": [42]},
    ],
)
def test_registration_metadata_outside_our_policy_is_refused(metadata: dict[str, object]) -> None:
    assert metadata_refusal({"redirect_uris": ["https://claude.ai/api/mcp/auth_callback"], **metadata}) is not None
