"""ASGI entry point: Daphne serves /mcp (the MCP SDK) and everything else (Django) on one port."""

from __future__ import annotations

import importlib
import os
import sys

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "sandstorm_site.settings")

from django.core.exceptions import ImproperlyConfigured  # noqa: E402

try:
    importlib.import_module(os.environ["DJANGO_SETTINGS_MODULE"])
except ImproperlyConfigured as exc:
    print(f"sandstorm: configuration error: {exc}", file=sys.stderr)
    sys.exit(2)

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.conf import settings  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402
from django.core.asgi import get_asgi_application  # noqa: E402
from django.urls import path, re_path  # noqa: E402

django_application = get_asgi_application()  # sets Django up before anything imports models

from mcpserver.application import build_mcp_application  # noqa: E402
from mcpserver.console_socket import build_websocket_application  # noqa: E402
from mcpserver.lifespan import LifespanApp, install_reactor_hooks  # noqa: E402
from sandstorm_site import daphne_tweaks  # noqa: E402
from sandstorm_site.accesslog import AccessLogMiddleware  # noqa: E402

daphne_tweaks.apply()
mcp_application = build_mcp_application()
install_reactor_hooks(mcp_application.runner)

application = ProtocolTypeRouter(
    {
        "http": AccessLogMiddleware(
            URLRouter(
                # channels' URLRouter routes to ASGI applications; django-stubs types path() for Django views only.
                [
                    path("mcp", mcp_application.asgi),  # type: ignore[arg-type]  # an ASGI app, see above
                    re_path(r"", ASGIStaticFilesHandler(django_application)),  # type: ignore[arg-type]  # likewise
                ]
            )
        ),
        # The console's live socket (/admin/live/socket): Origin, then session and user, then the consumer.
        "websocket": build_websocket_application(settings.PUBLIC_URL),
        "lifespan": LifespanApp(mcp_application.runner),
    }
)
