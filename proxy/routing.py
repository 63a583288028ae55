"""URL patterns of the proxied model routes and WebSockets, served by Channels consumers (everything else is Django)."""

from django.urls import re_path

from proxy.http.comfyui import ComfyUIConsumer
from proxy.http.consumers import OpenAIConsumer, UpstreamConsumer
from proxy.serving.inbound import MODEL_ROUTES
from proxy.websockets.passthrough import WebSocketPassthrough

_MODEL_ROUTE = "|".join(sorted(r.lstrip("/").replace(".", r"\.") for r in MODEL_ROUTES))

http_patterns = [
    re_path(rf"^(?:{_MODEL_ROUTE})$", OpenAIConsumer.as_asgi()),
    re_path(r"^upstream/.+", UpstreamConsumer.as_asgi()),
    re_path(r"^comfyui(?:/.*)?$", ComfyUIConsumer.as_asgi()),
]
websocket_patterns = [
    re_path(r"^upstream/.+", WebSocketPassthrough.as_asgi()),
    re_path(r"^comfyui(?:/.*)?$", WebSocketPassthrough.as_asgi()),
    re_path(r"", WebSocketPassthrough.as_asgi()),  # any other path: refused with 4404, not a server error
]
