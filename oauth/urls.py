"""The OAuth endpoints we use, and nothing else of the toolkit's (no introspection, device flow, application
management or OIDC pages). Named as in the toolkit's namespace, which its metadata views reverse; included at the
site root, so the well-known documents are where RFC 8414 and RFC 9728 clients look for them."""

from __future__ import annotations

from django.urls import path
from oauth2_provider import views as toolkit

from oauth.views.consent import ConsentView
from oauth.views.registration import RegistrationManagementView, RegistrationView

app_name = "oauth2_provider"

urlpatterns = [
    path("oauth/authorize/", ConsentView.as_view(), name="authorize"),
    path("oauth/token/", toolkit.TokenView.as_view(), name="token"),
    path("oauth/revoke/", toolkit.RevokeTokenView.as_view(), name="revoke-token"),
    path("oauth/register/", RegistrationView.as_view(), name="dcr-register"),
    path("oauth/register/<str:client_id>/", RegistrationManagementView.as_view(), name="dcr-register-management"),
    path(
        ".well-known/oauth-authorization-server",
        toolkit.OAuthServerMetadataView.as_view(),
        name="oauth-server-metadata",
    ),
    # RFC 9728: the path form for the resource <public url>/mcp first, then the root form some clients try.
    path(
        ".well-known/oauth-protected-resource/mcp",
        toolkit.OAuthProtectedResourceMetadataView.as_view(),
        name="oauth-resource-metadata-path",
    ),
    path(
        ".well-known/oauth-protected-resource",
        toolkit.OAuthProtectedResourceMetadataView.as_view(),
        name="oauth-resource-metadata",
    ),
]
