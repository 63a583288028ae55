"""`/comfyui/<path>`: ComfyUI's web app, served through the reserved model `comfyui_auto`.

Only a request for `/comfyui/` itself may start the model. An open ComfyUI tab keeps fetching its
assets, queue and websocket; once the model is unloaded, those stale requests must not load it back
and take the GPU from whatever runs now, so they get 409 until someone opens `/comfyui/` again.
"""

from __future__ import annotations

from urllib.parse import quote

from proxy.config.compat import COMFYUI_MODEL_ID
from proxy.http.consumers import ModelConsumer, climbs_out
from proxy.serving.errors import ProxyError
from proxy.service import get_service
from scheduling.door.questions import Processes
from scheduling.core import ModelState

COMFYUI_PREFIX = "/comfyui"


def comfyui_model(service):
    """The comfyui_auto model's config; 404 when the config has none."""
    model = service.config.models.get(COMFYUI_MODEL_ID)
    if model is None:
        raise ProxyError(
            404, f"/comfyui/ serves the model '{COMFYUI_MODEL_ID}', and the config has no model of that name",
            "model_not_found",
        )
    return model


def comfyui_rest(scope) -> str | None:
    """The still-encoded path after /comfyui ("/..."), or None for a bare /comfyui; 400 for a '..' segment."""
    raw = (scope.get("raw_path") or quote(scope["path"]).encode()).decode("latin-1").split("?", 1)[0]
    rest = raw[len(COMFYUI_PREFIX):]
    if not rest:
        return None
    if climbs_out(rest):
        raise ProxyError(400, f"{COMFYUI_PREFIX}{rest}: '..' path segments are not forwarded", "invalid_path")
    return rest


async def is_ready(service, model_id: str) -> bool:
    return (await service.door.ask(Processes())).get(model_id) == ModelState.READY


def not_loaded(model_id: str, why: str) -> ProxyError:
    return ProxyError(409, f"model '{model_id}' is not loaded; {why}", "model_not_loaded")


class ComfyUIConsumer(ModelConsumer):
    """Any method on /comfyui/<path>: forwarded to comfyui_auto as /<path>, scheduled like /upstream."""

    async def handle(self, body: bytes) -> None:
        service = get_service()
        headers = await self.authorise(service)
        model_cfg = comfyui_model(service)
        self.check_model(model_cfg.id)  # before anything that tells the model's state (409)
        rest = comfyui_rest(self.scope)
        query = self.scope.get("query_string", b"").decode("latin-1")
        if rest is None:
            status = 301 if self.scope["method"] in ("GET", "HEAD") else 308
            target = f"{COMFYUI_PREFIX}/" + (f"?{query}" if query else "")
            await self.send_response(status, b"", headers=[(b"location", target.encode("latin-1"))])
            return
        if rest != "/" and not await is_ready(service, model_cfg.id):
            raise not_loaded(model_cfg.id, f"only {COMFYUI_PREFIX}/ starts it")
        await self.serve(
            service, model_cfg, requested=model_cfg.id, stream=False, method=self.scope["method"],
            upstream_path=rest + (f"?{query}" if query else ""), body=body, headers=headers,
        )
