"""A model's `compat` settings, and what the reserved `comfyui_auto` model always gets.

ComfyUI's browser tab holds a progress websocket open as long as it is open; counted as a request,
it would keep the model busy forever, so its TTL never fires and no other model gets the GPU.
"""

from __future__ import annotations

from .fields import Section

# The model `/comfyui/` serves: naming a model so opts it into the settings below.
COMFYUI_MODEL_ID = "comfyui_auto"
# The browser opens many requests at once (assets, the queue, history); ten would refuse some.
COMFYUI_MIN_CONCURRENCY = 50


def read_ignore_websockets(section: Section, model_id: str) -> bool:
    """`compat.ignoreWebsockets`: WebSocket upgrades bypass the scheduler (forced on for comfyui_auto)."""
    compat = section.section("compat")
    if compat is None:
        return model_id == COMFYUI_MODEL_ID
    ignore = compat.boolean("ignoreWebsockets", False)
    compat.warn_unread()
    return ignore or model_id == COMFYUI_MODEL_ID


def concurrency_floor(model_id: str, limit: int) -> int:
    """The model's concurrencyLimit, raised to COMFYUI_MIN_CONCURRENCY for comfyui_auto."""
    return max(limit, COMFYUI_MIN_CONCURRENCY) if model_id == COMFYUI_MODEL_ID else limit
