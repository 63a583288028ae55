"""The consumers that take each model request, wait for the GPU, and stream the answer back."""

from __future__ import annotations

import asyncio
import logging
import re
from urllib.parse import quote, unquote

from proxy.serving.access import OPEN, Caller, Denied, Need, model_refusal, route_refusal
from proxy.serving.auth import CREDENTIAL_HEADERS
from proxy.serving.key_cache import KEYS, caller_of
from proxy.serving.key_watch import queue_closed_when_revoked
from proxy.serving.quota_gate import within_quota
from proxy.serving.token_tally import Tally
from proxy.upstream.captures import CaptureRecorder, begin_capture
from proxy.serving.cross_site import CROSS_SITE_CODE, cross_site_refusal
from proxy.serving.errors import ProxyError, error_event
from proxy.serving.holding import holding, ticket_request
from proxy.http.hosts import host_refusal
from proxy.http.ignored_paths import refuse_unless_ready, send_unscheduled
from proxy.http.streaming import StreamingHttpConsumer
from proxy.http.loading_state import shows_loading_state, wait_showing_state
from proxy.serving.model_choice import choose_model, pinned_upstream_path
from proxy.serving.inbound import MODEL_ROUTES, forwarded_body, off_loop_when_large, read_model_request
from proxy.serving.usage_asked import needs_usage_asked, raw_body_asking_usage
from proxy.upstream.peer_relay import peer_for, query_naming, serve_peer, serve_peer_body
from proxy.upstream.relay import as_sent, identity_headers, relay, upstream_headers
from proxy.serving.route_paths import model_in_query, route_methods, upstream_path
from proxy.service import get_service
from proxy.config.upstream_paths import is_ignored
from scheduling.tickets import Refused, stamped

log = logging.getLogger("llamaswap.proxy")
# What an upstream server may read as a path separator once it decodes %2f or %5c.
_PATH_SEPARATORS = re.compile(r"[/\\]")


def climbs_out(path: str) -> bool:
    """Whether a '..' segment, plain or percent-encoded, could lead above the model's base URL."""
    return ".." in _PATH_SEPARATORS.split(unquote(path))


class ModelConsumer(StreamingHttpConsumer):
    """Shared path of every model request: authorise, queue, relay, release."""

    #: Collects the exchange for `GET /api/captures/<id>` when captureBuffer is on.
    capture: CaptureRecorder | None = None
    #: Whose key sent the request (`authorise`).
    caller: Caller = OPEN
    #: What the request spends against its key's tpm, fed what is relayed (`serve`).
    tally: Tally | None = None

    async def send_headers(self, *, status=200, headers=None):
        if self.capture is not None:
            self.capture.response_started(status, headers or [])
        await super().send_headers(status=status, headers=headers)

    async def send_body(self, body, *, more_body=False):
        if self.tally is not None:
            self.tally.relayed(body)
        if self.capture is not None:
            self.capture.response_sent(body)
            if not more_body:
                self.capture.finish()
        await super().send_body(body, more_body=more_body)

    async def send_error(self, exc: ProxyError) -> None:
        """Answer `exc`; a refusal of a row key's request that has no row (one refused at the door: outside its
        scope, over its quota, bad input) is counted for the key's usage page."""
        if self.caller.scope.name and "X-LlamaSwap-Request-Id" not in exc.headers:
            KEYS.refused(self.caller.scope.name, exc.status)
        await super().send_error(exc)

    async def disconnect(self):
        if self.capture is not None:
            self.capture.finish()  # the client left mid-response: keep what it was sent

    def body_limit(self) -> int:
        service = get_service()
        return service.config.max_request_body_bytes

    async def authorise(self, service) -> dict[str, str]:
        headers = self.header_map()
        self.check_host(headers)
        caller = await caller_of(headers, service.config.api_keys)
        if isinstance(caller, Denied):
            raise refused(caller)
        self.caller = caller
        if refusal := cross_site_refusal(headers, caller):  # any model request may start a model
            raise ProxyError(403, refusal, CROSS_SITE_CODE)
        if denied := route_refusal(caller, Need.INFERENCE):
            raise refused(denied)
        if self.body_too_large:
            raise ProxyError(
                413,
                f"the request body is over the {service.config.max_request_body_bytes} byte limit (maxRequestBodyBytes)",
                "request_too_large",
            )
        return headers

    def check_model(self, model: str, asked: str | None = None) -> None:
        """The caller's key must allow `model` (its ID, or a peer's `<peer>/<model>`), named as `asked` if refused."""
        if denied := model_refusal(self.caller, model, asked):
            raise refused(denied)

    def counts_tokens_of(self, parsed) -> bool:
        """Whether the body must ask a stream for its usage: the caller's tpm quota counts its tokens."""
        return self.caller.scope.limits.tpm is not None and needs_usage_asked(self.scope["path"], parsed.payload)

    def check_host(self, headers: dict[str, str]) -> None:
        """The served Host names, as on the Django routes: a browser lured by DNS rebinding gets no model."""
        host = headers.get("host")
        if host is None:
            return  # browsers always send Host; without one there is no name to rebind
        refusal = host_refusal(host)
        if refusal:
            raise ProxyError(400, refusal, "host_not_allowed")

    def client_address(self) -> str:
        client = self.scope.get("client") or ("", 0)
        return str(client[0] or "")

    async def serve(self, service, model_cfg, *, requested: str, stream: bool, method: str,
                    upstream_path: str, body: bytes, headers: dict[str, str], selector: str = "") -> None:
        self.check_model(model_cfg.id)
        scope = self.caller.scope
        async with within_quota(scope) as tally, queue_closed_when_revoked(service.door, scope.name):
            self.tally, tally.prompt_bytes = tally, len(body)
            await self.serve_scheduled(service, model_cfg, tally, requested=requested, stream=stream, method=method,
                                       upstream_path=upstream_path, body=body, headers=headers, selector=selector)

    async def serve_scheduled(self, service, model_cfg, tally: Tally, *, requested: str, stream: bool, method: str,
                              upstream_path: str, body: bytes, headers: dict[str, str], selector: str) -> None:
        """Queue the request, relay the model's answer once granted, and note how it ended in `tally`."""
        door = service.door
        self.capture = begin_capture(self.scope["path"], upstream_path, headers, body)
        request = ticket_request(self.scope, headers, model=model_cfg.id, requested=requested, method=method,
                                 stream=stream, selector=selector, key=self.caller.scope)
        loop = asyncio.get_running_loop()
        asked = loop.time()
        try:
            if shows_loading_state(model_cfg, self.scope["path"], stream):
                lease = await wait_showing_state(self, door, request, loading_stream_headers, self.caller.scope)
            else:
                lease = await door.submit(request)
        except Refused as exc:
            message = self.caller.scope.told(exc.message)  # it may say why it waited: of the key's models only
            if self.response_started:  # the loading state began the stream: the refusal ends it
                await self.send_body(error_event(exc.status, message, exc.code))
                return
            headers = {} if exc.ticket_id is None else identity_headers(exc.ticket_id, loop.time() - asked)
            if exc.retry_after:
                headers["Retry-After"] = str(int(exc.retry_after))
            raise ProxyError(exc.status, message, exc.code, headers=headers) from None
        identity = identity_headers(lease.ticket_id, loop.time() - asked)
        if self.capture is not None:
            self.capture.ticket_id = lease.ticket_id
        try:
            def ended(outcome):
                tally.ended(outcome)
                door.release(lease.ticket_id, stamped(outcome, loop.time()))

            async with holding(ended, lambda: lease.cut) as held:
                lease.held_by(asyncio.current_task())
                drop = CREDENTIAL_HEADERS if self.caller.keyed else frozenset()
                async with service.client_for(model_cfg) as client:
                    await relay(
                        self, client, model_cfg.id, method, lease.upstream + upstream_path,
                        as_sent(upstream_headers(headers, drop)), body, held.end,
                        [(k.lower().encode(), v.encode()) for k, v in identity.items()],
                    )
        except ProxyError as exc:
            exc.headers.update(identity)
            raise
        if held.cut is not None:
            await self.end_cut_short(held.cut, stream, identity)

    async def end_cut_short(self, cut: Refused, stream: bool, identity: dict[str, str]) -> None:
        """The runtime took the GPU back mid-request (an operator unloaded the model): tell the client why."""
        message = self.caller.scope.told(cut.message)
        if not self.response_started:
            raise ProxyError(cut.status, message, cut.code, headers=dict(identity))
        await self.send_body(error_event(cut.status, message, cut.code) if stream else b"")


def refused(denied: Denied) -> ProxyError:
    return ProxyError(denied.status, denied.message, denied.code, headers=denied.headers())


def loading_stream_headers(ticket_id: int | None) -> list[tuple[bytes, bytes]]:
    """The headers of a stream the loading state begins, before the model answers: an SSE stream,
    with the request's id once the scheduler has told it."""
    headers = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]
    if ticket_id is not None:
        headers.append((b"x-llamaswap-request-id", str(ticket_id).encode()))
    return headers


class OpenAIConsumer(ModelConsumer):
    """POST /v1/chat/completions and the other model routes whose body names the model."""

    async def handle(self, body: bytes) -> None:
        service = get_service()
        headers = await self.authorise(service)
        path = self.scope["path"]
        methods = route_methods(path)
        if self.scope["method"] not in methods:
            allowed = ", ".join(methods)
            raise ProxyError(405, f"{path} accepts {allowed} only", "method_not_allowed", headers={"Allow": allowed})
        if path not in MODEL_ROUTES:
            raise ProxyError(404, f"no route {path}", "route_not_found")
        query = self.scope.get("query_string", b"").decode("latin-1")
        if self.scope["method"] == "GET":
            requested = model_in_query(path, query)
            choice = await choose_model(service, requested)  # the query is forwarded as sent
            try:
                if (found := peer_for(service.config, choice.model)) is not None:
                    await serve_peer(self, service, *found, requested=requested, stream=False, method="GET",
                                     upstream_path=upstream_path(path) + "?" + query_naming(query, found[1]),
                                     body=b"", headers=headers,
                                     selector=choice.selector)
                    return
                model_cfg = service.resolve_model(choice.model, self.caller.scope, requested)
                await self.serve(
                    service, model_cfg, requested=requested, stream=False, method="GET",
                    upstream_path=upstream_path(path) + f"?{query}", body=b"", headers=headers, selector=choice.selector,
                )
            finally:
                choice.release()
            return
        parsed = await off_loop_when_large(body, read_model_request, path, headers.get("content-type", ""), body)
        choice = await choose_model(service, parsed.requested_model)  # the active profile's pin, a selector
        asked, parsed = parsed.requested_model, choice.applied_to(parsed)
        try:
            if (found := peer_for(service.config, parsed.requested_model)) is not None:
                await serve_peer_body(self, service, found, parsed, asked=asked, headers=headers, selector=choice.selector,
                                      upstream_path=upstream_path(path) + (f"?{query}" if query else ""))
                return
            model_cfg = service.resolve_model(parsed.requested_model, self.caller.scope, asked)
            forwarded = await off_loop_when_large(
                body, forwarded_body, parsed, model_cfg.use_model_name or choice.body_model, model_cfg.filters,
                self.counts_tokens_of(parsed),
            )
            await self.serve(
                service, model_cfg, requested=asked, stream=parsed.stream, method="POST",
                upstream_path=upstream_path(path) + (f"?{query}" if query else ""), body=forwarded, headers=headers,
                selector=choice.selector,
            )
        finally:
            choice.release()


class UpstreamConsumer(ModelConsumer):
    """Any method on /upstream/<model>/<path>: straight through to that model's server, still scheduled
    (but for upstream.ignorePaths: proxy/http/ignored_paths.py)."""

    async def handle(self, body: bytes) -> None:
        service = get_service()
        headers = await self.authorise(service)
        raw = self.scope.get("raw_path") or quote(self.scope["path"]).encode()
        rest = raw.decode("latin-1").split("?", 1)[0][len("/upstream/"):]
        # The key's scope first: before anything that tells the model's state (409, a redirect) or that it exists.
        pinned = await pinned_upstream_path(service, rest)
        model_cfg, remainder = service.resolve_upstream_path(pinned, self.caller.scope, rest)
        if remainder is not None and climbs_out(remainder):
            raise ProxyError(400, f"/upstream/{rest}: '..' path segments are not forwarded", "invalid_path")
        if remainder is None:
            target = f"/upstream/{rest}/"
            query = self.scope.get("query_string", b"")
            if query:
                target += "?" + query.decode("latin-1")
            await self.send_response(308, b"", headers=[(b"location", target.encode("latin-1"))])
            return
        query = self.scope.get("query_string", b"").decode("latin-1")
        if self.caller.scope.limits.tpm is not None and self.scope["method"] == "POST":
            body = await off_loop_when_large(body, raw_body_asking_usage, unquote("/" + remainder),
                                             headers.get("content-type", ""), body)
        forward = dict(method=self.scope["method"], upstream_path="/" + remainder + (f"?{query}" if query else ""),
                       body=body, headers=headers)
        if is_ignored(unquote("/" + remainder), service.config.ignore_paths):
            await refuse_unless_ready(service, model_cfg, "/" + remainder)
            if service.fleet is not None:
                await send_unscheduled(self, service, model_cfg, **forward)
                return
        await self.serve(service, model_cfg, requested=model_cfg.id, stream=False, **forward)
