"""The model routes llama-swap serves under another name than the model server's, and the path each
is forwarded to: versionless `/v/...` aliases drop the `/v`, audio.cpp's `/audioapi/...` drops
`/audioapi`. Also the GET routes that name their model in the query string."""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import parse_qs

from proxy.serving.errors import ProxyError

VERSIONLESS_PREFIX = "/v"
AUDIOAPI_PREFIX = "/audioapi"
# POST routes of llama.cpp, stable-diffusion.cpp and audio.cpp servers whose JSON body names the model.
EXTRA_JSON_ROUTES = frozenset({"/v1/audio/voices", "/sdapi/v1/txt2img", "/sdapi/v1/img2img", "/audioapi/v1/tasks/run"})
# GET routes whose model comes from `?model=` (llama-server's /props, TTS voices, stable-diffusion LoRAs).
QUERY_ROUTES = frozenset({"/props", "/v1/audio/voices", "/sdapi/v1/loras"})


def versionless(routes: Iterable[str]) -> frozenset[str]:
    """The `/v/...` alias of each `/v1/...` route (clients that append their own version segment)."""
    return frozenset(VERSIONLESS_PREFIX + route[len("/v1"):] for route in routes if route.startswith("/v1/"))


GET_ROUTES = QUERY_ROUTES | versionless(QUERY_ROUTES)


def upstream_path(path: str) -> str:
    """The path a model route is forwarded to."""
    for prefix in (VERSIONLESS_PREFIX, AUDIOAPI_PREFIX):
        if path.startswith(prefix + "/"):
            return path[len(prefix):]
    return path


def model_in_query(path: str, query: str) -> str:
    """The `model` a GET model route names; 400 when it names none."""
    values = parse_qs(query, keep_blank_values=True).get("model", [])
    model = values[0].strip() if values else ""
    if not model:
        raise ProxyError(400, f"GET {path} needs the model in the query string: {path}?model=<id>", "model_missing")
    return model


# GET routes that also take a JSON body naming the model (/v1/audio/voices and its versionless alias).
_GET_AND_POST_ROUTES = GET_ROUTES & (EXTRA_JSON_ROUTES | versionless(EXTRA_JSON_ROUTES))


def route_methods(path: str) -> tuple[str, ...]:
    """The methods a model route takes: POST, GET for those that read `?model=`, or both (/v1/audio/voices)."""
    if path not in GET_ROUTES:
        return ("POST",)
    return ("GET", "POST") if path in _GET_AND_POST_ROUTES else ("GET",)
