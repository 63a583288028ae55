"""`/upstream/<model>/<path>` requests whose path matches `upstream.ignorePaths`.

A model's web UI left open in a browser keeps fetching scripts, styles and icons. As in llama-swap,
such a request never starts the model, never waits in the queue and is not scheduled: it reaches
the model only while the model is ready, and is answered 409 otherwise. Not being scheduled, it
does not count toward concurrencyLimit, does not keep the model from idling out (ttl) and does
not get a request row.

A front end of the distributed mode cannot reach the model server without the worker's address
for it, which only a lease carries: there the request is scheduled as usual once the model is
found ready (it queues behind the model's other requests, and it is counted).
"""

from __future__ import annotations

from proxy.serving.auth import CREDENTIAL_HEADERS
from proxy.serving.errors import ProxyError
from proxy.upstream.relay import as_sent, relay, upstream_headers
from scheduling.door.questions import Processes
from scheduling.core import ModelState


async def refuse_unless_ready(service, model_cfg, path: str) -> None:
    if (await service.door.ask(Processes())).get(model_cfg.id, ModelState.STOPPED) != ModelState.READY:
        raise ProxyError(
            409,
            f"model '{model_cfg.id}' is not loaded, and {path} matches upstream.ignorePaths, which never "
            "loads a model; load it first (any other request to it does)",
            "model_not_loaded",
        )


async def send_unscheduled(consumer, service, model_cfg, *, method: str, upstream_path: str, body: bytes,
                           headers: dict[str, str]) -> None:
    """Relay straight to the ready model's server, without a lease (this process runs the models); the
    consumer has checked the caller's key allows the model."""
    drop = CREDENTIAL_HEADERS if consumer.caller.keyed else frozenset()
    async with service.client_for(model_cfg) as client:
        await relay(consumer, client, model_cfg.id, method, service.fleet.upstream_url(model_cfg.id) + upstream_path,
                    as_sent(upstream_headers(headers, drop)), body)
