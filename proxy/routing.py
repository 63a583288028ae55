"""URL patterns of the proxied model routes, served by Channels consumers (everything else is Django)."""

from django.urls import re_path

from proxy.consumers import OpenAIConsumer, UpstreamConsumer
from proxy.inbound import MODEL_ROUTES

_MODEL_ROUTE = "|".join(sorted(r.lstrip("/").replace(".", r"\.") for r in MODEL_ROUTES))

http_patterns = [
    re_path(rf"^(?:{_MODEL_ROUTE})$", OpenAIConsumer.as_asgi()),
    re_path(r"^upstream/.+", UpstreamConsumer.as_asgi()),
]
