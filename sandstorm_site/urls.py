from django.contrib import admin
from django.urls import include, path
from django.views.generic import RedirectView

from mcpserver.health import health

urlpatterns = [
    path("", RedirectView.as_view(url="/admin/", permanent=False)),
    path("health", health, name="health"),
    path("admin/audit/", include("audit.urls")),  # before the admin: its catch-all would take these paths
    path("admin/", admin.site.urls),
    # OAuth: /oauth/{authorize,token,revoke,register}/ and the /.well-known/ metadata documents.
    path("", include("oauth.urls")),
]
