"""One batch line sent as a model request: through the scheduler at the batch's priority (a row like any
request's), relayed to the model, its answer kept for the output file. The same steps as an HTTP request
(`proxy.http.consumers`): model choice, the scheduler's lease held by `holding()`, `relay()`."""

from __future__ import annotations

import asyncio
import json

from django.utils import timezone

from proxy.batches.batch_rows import error_line
from proxy.batches.line_quota import paced
from proxy.batches.storage import new_id
from proxy.serving.model_choice import choose_model
from proxy.serving.errors import ProxyError, error_body
from proxy.serving.holding import holding
from proxy.serving.inbound import ModelRequest, forwarded_body, route_label
from proxy.serving.key_cache import KEYS
from proxy.serving.token_tally import Tally
from proxy.serving.route_paths import upstream_path
from proxy.upstream.peer_relay import peer_for
from proxy.upstream.relay import relay
from scheduling.keys.scope import KeyScope
from scheduling.tickets import Refused, TicketRequest, stamped

# The scheduler stopped for a shutdown: the line is not ended, it runs again after the restart.
SHUTTING_DOWN = "shutting_down"
# The model could not be reached, or stopped mid-answer: the line may run again (`ModelGone`).
UNREACHABLE = "upstream_unreachable"
CUT_OFF = "upstream_failed"


class Interrupted(Exception):
    """The line could not finish because the service is stopping; it stays to run again."""


class ModelGone(Exception):
    """The line's model stopped answering before its answer was whole: its process died, or a worker taking over
    from a dead one stopped it. The line may run again; `result` is its error line should it not."""

    def __init__(self, result: dict) -> None:
        super().__init__(result["response"]["body"])
        self.result = result


class KeptResponse:
    """A `ResponseSink` that keeps the answer for the output file."""

    response_started = False

    def __init__(self) -> None:
        self.status = 0
        self.parts: list[bytes] = []

    async def send_headers(self, *, status: int = 200, headers=None) -> None:
        self.response_started = True
        self.status = status

    async def send_body(self, body: bytes, *, more_body: bool = False) -> None:
        if body:
            self.parts.append(body)

    def body(self):
        raw = b"".join(self.parts)
        try:
            return json.loads(raw)
        except (ValueError, UnicodeDecodeError, RecursionError):
            return raw.decode("utf-8", "replace")


async def send_line(service, custom_id: str, url: str, body: dict, priority: int, key: KeyScope,
                    stop: asyncio.Event) -> tuple[bool, dict]:
    """(succeeded, the line of the output or error file), sent with the rights of the batch's key, within its
    quotas (`line_quota`: waiting for its turn, Stopped once `stop` is set). Raises Interrupted when the service
    is stopping, ModelGone when the model stopped answering."""
    request_id, gone = "", False
    try:
        async with paced(key.name, stop) as tally:
            weight = await _weight_if_valid(key)
            choice = await choose_model(service, body["model"])
            try:
                if peer_for(service.config, body["model"]) is not None:
                    raise ProxyError(400, f"model '{body['model']}' is a peer's; a batch runs local models only",
                                     "model_not_supported")
                parsed = choice.applied_to(ModelRequest(body["model"], False, json.dumps(body).encode(),
                                                        "application/json", body))
                model_cfg = service.resolve_model(parsed.requested_model, key, body["model"])
                forwarded = forwarded_body(parsed, model_cfg.use_model_name or choice.body_model, model_cfg.filters)
                status, answer, request_id, gone = await _scheduled(service, model_cfg, body["model"], url,
                                                                    forwarded, priority, key, weight, tally)
            finally:
                choice.release()
    except Refused as exc:
        if exc.code == SHUTTING_DOWN:
            raise Interrupted() from None
        return False, error_line(custom_id, exc.code, key.told(exc.message))
    except ProxyError as exc:
        status, answer = exc.status, json.loads(error_body(exc.status, exc.message, exc.code))
        gone = exc.code == UNREACHABLE
    response = {"status_code": status, "request_id": request_id, "body": answer}
    result = {"id": new_id("batch_req_"), "custom_id": custom_id, "response": response, "error": None}
    if gone:
        raise ModelGone(result)
    return 200 <= status < 300, result


async def _weight_if_valid(key: KeyScope) -> int:
    """The fair-share weight of the batch's key as its row is now. A batch's lines run with its key's rights: a
    key revoked, expired or deleted since has none (with the key table unreadable past its stale limit, the lines
    go on at weight 1: the batch is not failed by a database blink)."""
    if not key.name:
        return 1  # made with a config file's key, or on an open server
    rows = await KEYS.current_async()
    if rows is None:
        return 1
    why = rows.refusal_of(key.name, timezone.now())
    if why is not None:
        raise ProxyError(401, f"{why}; the batch's lines run with its rights", "invalid_api_key")
    return rows.named(key.name).scope.weight


async def _scheduled(service, model_cfg, requested: str, url: str, body: bytes, priority: int, key: KeyScope,
                     weight: int, tally: Tally):
    door = service.door
    loop = asyncio.get_running_loop()
    lease = await door.submit(TicketRequest(model=model_cfg.id, path=url, priority=priority, requested_model=requested,
                                            client="batch", route=route_label(url), api_key=key.name,
                                            key_weight=weight))
    kept = KeptResponse()
    async with holding(lambda outcome: door.release(lease.ticket_id, stamped(outcome, loop.time())),
                       lambda: lease.cut) as held:
        lease.held_by(asyncio.current_task())
        async with service.client_for(model_cfg) as client:
            outcome = await relay(kept, client, model_cfg.id, "POST", lease.upstream + upstream_path(url),
                                  [(b"content-type", b"application/json")], body, held.end)
    tally.ended(outcome)
    if held.cut is not None:
        if held.cut.code == SHUTTING_DOWN:
            raise Interrupted()
        raise held.cut
    request_id = str(lease.ticket_id)
    if outcome.status_code != kept.status:  # the model's headers said one status, the relay ended with a 502
        return outcome.status_code, json.loads(error_body(outcome.status_code, outcome.error, CUT_OFF)), request_id, True
    return kept.status, kept.body(), request_id, False
