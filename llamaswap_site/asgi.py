"""ASGI entry point: model routes go to Channels consumers, everything else to Django."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llamaswap_site.settings")
django_asgi_app = get_asgi_application()  # must run before the consumers import models

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.urls import re_path  # noqa: E402

from proxy.http.cors import PreflightAnswerer  # noqa: E402
from proxy.serving.disk_full import DiskFullAnswerer  # noqa: E402
from proxy.routing import http_patterns, websocket_patterns  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": PreflightAnswerer(URLRouter([*http_patterns, re_path(r"", DiskFullAnswerer(django_asgi_app))])),
        "websocket": URLRouter(websocket_patterns),
    }
)
