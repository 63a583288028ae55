"""Serving a peer's model: the request goes straight to the peer, never through the scheduler.

A peer is another server (llama-swap, llamaswap, a hosted API) that schedules its own work, so its
requests do not queue behind local models. They are still recorded like local ones: a row (with the
peer's ID) for the activity log, the request id header, and the request metrics.

The caller's credentials are for this server, not the peer's: no header that may carry a secret
(proxy.serving.auth.SECRET_HEADERS: Authorization, x-api-key, hosted APIs' key headers, Proxy-Authorization, cookies)
is forwarded; the peer's `apiKey`, when set, is sent instead, as `Authorization: Bearer <key>` and
`x-api-key: <key>`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from urllib.parse import quote_plus, unquote_plus

from proxy.serving.auth import SECRET_HEADERS
from proxy.upstream.captures import begin_capture
from proxy.config.peers import PeerConfig
from proxy.config.secrets import shown_url
from proxy.serving.errors import ProxyError
from proxy.serving.holding import holding, ticket_request
from proxy.serving.inbound import ModelRequest, forwarded_body, off_loop_when_large
from proxy.serving.quota_gate import within_quota
from proxy.serving.token_tally import Tally
from proxy.upstream.relay import as_sent, identity_headers, relay, upstream_headers
from scheduling.core import PRIORITY_HEADER
from scheduling.tickets import Outcome, Refused

log = logging.getLogger("llamaswap.proxy")


def peer_for(config, name: str) -> tuple[PeerConfig, str] | None:
    """The peer serving `name` and its own name for the model; None when `name` is no peer model.
    Raises 404 for a bare name several peers list: only their `<peer>/<model>` names are clear."""
    found = config.peer_model(name)
    if found is None and config.resolve(name) is None:
        offering = config.peers_offering(name)
        if len(offering) > 1:
            raise ProxyError(
                404, f"model '{name}' is offered by several peers; ask for one of: {', '.join(offering)}",
                "model_not_found",
            )
    return found


def listed_peer_models(config, created: int) -> list[dict]:
    """`/v1/models` entries of the peers' models, as `<peer>/<model>` (one a local name shadows is left out)."""
    return [
        {
            "id": qualified,
            "object": "model",
            "created": created,
            "owned_by": "llamaswap",
            "name": f"{peer.id}: {model}",
            "description": "",
            "meta": {"llamaswap": {"type": "peer", "peerID": peer.id}},
        }
        for qualified, peer, model in _reachable(config)
    ]


def peer_model_states(config) -> list[dict]:
    """The peers' models in `/api/events` `modelStatus`: no process here, so no state; `peerID` names the peer."""
    return [
        {"id": qualified, "name": f"{peer.id}: {model}", "description": "", "state": "", "unlisted": False,
         "peerID": peer.id, "aliases": []}
        for qualified, peer, model in _reachable(config)
    ]


def _reachable(config) -> list[tuple[str, PeerConfig, str]]:
    """(`<peer>/<model>`, peer, model) of every peer model no local name shadows."""
    return [
        (peer.qualified(model), peer, model)
        for peer in config.peers.values()
        for model in peer.models
        if config.resolve(peer.qualified(model)) is None
    ]


def query_naming(query: str, model: str) -> str:
    """A GET route's query string with its `model` as the peer names it; every other parameter keeps
    the bytes the caller sent (decoding and encoding again would change what the peer reads)."""
    pieces = query.split("&")
    for position, piece in enumerate(pieces):
        key, _, value = piece.partition("=")
        if unquote_plus(key) == "model" and unquote_plus(value) != model:
            pieces[position] = f"{key}={quote_plus(model)}"
    return "&".join(pieces)


PRIORITY = PRIORITY_HEADER.lower()


def peer_headers(headers: dict[str, str], peer: PeerConfig, priority: int | None) -> list[tuple[bytes, bytes]]:
    """The caller's headers less its credentials, plus the peer's key; the priority the peer sees is the one
    applied here (`priority`: its key's cap or default; None, none asked or given), never the caller's raw ask,
    which a peer trusting its own key would honour above the caller's cap."""
    sent = upstream_headers(headers, SECRET_HEADERS | {PRIORITY})
    if priority is not None:
        sent.append((PRIORITY, str(priority)))
    if peer.api_key:
        sent += [("authorization", f"Bearer {peer.api_key}"), ("x-api-key", peer.api_key)]
    return as_sent(sent)


async def serve_peer_body(consumer, service, found: tuple[PeerConfig, str], parsed: ModelRequest, *, asked: str,
                          upstream_path: str, headers: dict[str, str], selector: str = "") -> None:
    """A request whose body names a peer model: the body names it as the peer does, filtered for it
    (the peer's stripParams and setParams; useModelName is a local model's key)."""
    peer, model = found
    forwarded = await off_loop_when_large(
        parsed.body, forwarded_body, parsed, model if asked != model else "", peer.filters,
        consumer.counts_tokens_of(parsed),
    )
    await serve_peer(
        consumer, service, peer, model, requested=asked, stream=parsed.stream, method="POST",
        upstream_path=upstream_path, body=forwarded, headers=headers, selector=selector,
    )


async def serve_peer(consumer, service, peer: PeerConfig, model: str, *, requested: str, stream: bool,
                     method: str, upstream_path: str, body: bytes, headers: dict[str, str],
                     selector: str = "") -> None:
    """Relay one request to `peer`'s `model` (the body already names it as the peer does) and record it,
    within the caller's key's quotas as a local model's request is."""
    qualified = peer.qualified(model)
    consumer.check_model(qualified, requested)
    async with within_quota(consumer.caller.scope) as tally:
        consumer.tally, tally.prompt_bytes = tally, len(body)
        await _relay_to_peer(consumer, service, peer, qualified, tally, requested=requested, stream=stream,
                             method=method, upstream_path=upstream_path, body=body, headers=headers, selector=selector)


async def _relay_to_peer(consumer, service, peer: PeerConfig, qualified: str, tally: Tally, *, requested: str,
                         stream: bool, method: str, upstream_path: str, body: bytes, headers: dict[str, str],
                         selector: str) -> None:
    door = service.door
    url = peer.proxy + upstream_path
    # Its maximum wait is read (a malformed one refused, as for a local model); a peer's request never waits here.
    request = ticket_request(consumer.scope, headers, model=qualified, requested=requested, method=method,
                             stream=stream, selector=selector, key=consumer.caller.scope)
    asked = request.asked_priority is not None or consumer.caller.scope.default_priority is not None
    applied = request.priority if asked else None
    loop = asyncio.get_running_loop()
    began = loop.time()
    try:
        ticket_id = await door.begin_relayed(
            request, peer.id, f"relayed to peer '{peer.id}' at {shown_url(peer.proxy)}, not scheduled")
    except Refused as exc:  # the request could not be recorded: refused, as a local model's would be
        raise ProxyError(exc.status, exc.message, exc.code, headers={"Retry-After": str(int(exc.retry_after))}) from None
    identity = identity_headers(ticket_id, 0.0) if ticket_id is not None else {}
    consumer.capture = begin_capture(consumer.scope["path"], upstream_path, headers, body)
    if consumer.capture is not None:
        consumer.capture.ticket_id = ticket_id

    def record(outcome: Outcome) -> None:
        tally.ended(outcome)
        first_byte = outcome.first_byte_monotonic
        door.end_relayed(
            ticket_id, request, outcome, loop.time() - began, None if first_byte is None else first_byte - began
        )

    async with holding(record, lambda: service.peer_relays.cut_by) as held:
        try:
            with service.peer_relays.running():
                async with service.client_for_peer(peer) as client:
                    await relay(
                        consumer, client, qualified, method, url, peer_headers(headers, peer, applied), body, held.end,
                        [(k.lower().encode(), v.encode()) for k, v in identity.items()],
                    )
        except ProxyError as exc:
            if exc.status == 504:
                hint = f"it took longer than peers.{peer.id}.timeouts (responseHeader, connect) allow; raise them if it is only slow"
            else:
                hint = f"check that the peer is up and that peers.{peer.id}.proxy is its address"
            message = f"peer '{peer.id}' failed for {method} {shown_url(url)}: {exc.message} — {hint}"
            log.warning("%s", message)
            raise ProxyError(exc.status, message, exc.code, headers=identity) from None
    if held.cut is not None:
        await consumer.end_cut_short(held.cut, stream, identity)


class PeerRelays:
    """The peer requests being relayed, so that a shutdown can cut those still running when its drain
    is over, as the runtime cuts local ones: each client is told why, and each row says so."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task] = set()
        self.cut_by: Refused | None = None

    @contextlib.contextmanager
    def running(self):
        """Around one relay, in the task that serves it."""
        task = asyncio.current_task()
        self._tasks.add(task)
        try:
            yield
        finally:
            self._tasks.discard(task)

    async def cut(self, reason: Refused, wait_s: float = 5.0) -> None:
        """End every relay still running with `reason`, waiting up to `wait_s` for their clients to be told."""
        self.cut_by = reason
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=wait_s)
