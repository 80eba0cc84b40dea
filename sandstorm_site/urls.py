from django.contrib import admin
from django.urls import include, path
from django.views.generic import RedirectView

from mcpserver.health import health
from oauth.throttle import ThrottledLoginForm

admin.site.site_header = "Sandstorm"
admin.site.site_title = "Sandstorm admin"
admin.site.index_title = "Tokens, clients and audit"
admin.site.login_form = ThrottledLoginForm  # the consent page signs in here too

urlpatterns = [
    path("", RedirectView.as_view(url="/admin/", permanent=False)),
    path("health", health, name="health"),
    path("admin/audit/", include("audit.urls")),  # before the admin: its catch-all would take these paths
    path("admin/", admin.site.urls),
    # OAuth: /oauth/{authorize,token,revoke,register}/ and the /.well-known/ metadata documents.
    path("", include("oauth.urls")),
]
