from django.contrib import admin
from django.urls import path
from django.views.generic import RedirectView

from mcpserver.health import health

admin.site.site_header = "Sandstorm"
admin.site.site_title = "Sandstorm admin"
admin.site.index_title = "Tokens, clients and audit"

urlpatterns = [
    path("", RedirectView.as_view(url="/admin/", permanent=False)),
    path("health", health, name="health"),
    path("admin/", admin.site.urls),
]
