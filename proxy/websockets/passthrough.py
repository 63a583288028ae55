"""WebSockets on `/upstream/<model>/<path>` and `/comfyui/<path>`: frames both ways, closes both ways.

Without `compat.ignoreWebsockets` a socket is scheduled like a request: it may start the model, and
it holds its place for as long as it is open, so it counts toward concurrencyLimit and keeps the model
from idling out or being swapped. With it, the socket bypasses the scheduler: it reaches the model
only while the model is ready, and never keeps it loaded (a swap may stop the model under it).

daphne cannot answer a WebSocket handshake with a chosen HTTP status (any refusal before the accept
becomes 403) and drops close reasons, so a refusal accepts the socket and closes it at once with
code 4000 + the HTTP status the same request would get: 4401 wrong API key, 4404 unknown model,
4409 not loaded, 4429 over concurrencyLimit, 4502 the model server refused or failed.

A socket opened with a row key is closed with 4401 once that key no longer counts (revoked, disabled,
expired, deleted), and with 4403 once its row no longer lets it use the socket's model (its models narrowed, or
made read-only), within the bound a new request of it is refused in (`proxy.serving.key_watch`); its row records
it cancelled with 401 or 403 and why.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from channels.consumer import AsyncConsumer, get_handler_name
from channels.exceptions import StopConsumer

from proxy.serving.access import OPEN, Denied, Need, model_refusal, route_refusal
from proxy.serving.auth import CREDENTIAL_HEADERS, without_own_cookies
from proxy.serving.key_cache import KEYS, caller_of
from proxy.serving.key_watch import WATCH_S, queue_closed_when_revoked, until_refused
from proxy.serving.cross_site import CROSS_SITE_CODE, cross_site_refusal
from proxy.http.comfyui import COMFYUI_PREFIX, comfyui_model, comfyui_rest, is_ready, not_loaded
from proxy.http.consumers import climbs_out, refused
from proxy.serving.errors import ProxyError
from proxy.http.hosts import host_refusal
from proxy.serving.holding import holding, ticket_request
from proxy.service import get_service
from proxy.websockets.frames import MESSAGE_TOO_BIG, NO_STATUS, NORMAL_CLOSURE
from proxy.websockets.client import Closed, Message, ProtocolViolation, UpstreamRefused, connect
from scheduling.tickets import Outcome, Refused, RequestState, stamped

log = logging.getLogger("llamaswap.proxy")
REFUSAL_CODE_BASE = 4000
UPSTREAM_PREFIX = "/upstream/"
# How long a socket cut short (or left by its client) gives its model server to finish its side of the close
# before the lease goes: within the shutdown's wait for cut requests, so the models stop after it.
UPSTREAM_CLOSE_WAIT_S = 1.0


def refusal_code(status: int) -> int:
    return REFUSAL_CODE_BASE + status


def client_close_code(upstream: Closed) -> int:
    """The code to close the client with: daphne sends only 1000 and 3000-4999."""
    if not upstream.clean:
        return refusal_code(502)
    if upstream.code == NORMAL_CLOSURE or 3000 <= upstream.code <= 4999:
        return upstream.code
    return NORMAL_CLOSURE


class WebSocketPassthrough(AsyncConsumer):
    channel_layer_alias = None  # nothing reaches it but its own socket

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._job: asyncio.Task | None = None
        self._upstream = None
        self._accepted = False
        self._client_close_code: int | None = None
        self._closing_upstream = False
        self._caller = OPEN
        self._revoked: Refused | None = None  # its key stopped counting (4401), or may no longer use the model (4403)
        self._model: str | None = None  # the model it was let through to
        self._queued = False  # waiting in the scheduler's queue, where a revoked key's requests are refused

    async def dispatch(self, message):
        """Straight to the handler: this consumer never touches the database (see StreamingHttpConsumer)."""
        await getattr(self, get_handler_name(message))(message)

    async def websocket_connect(self, message):
        self._job = asyncio.get_running_loop().create_task(self._run())

    async def websocket_receive(self, message):
        if self._upstream is None:
            return
        text = message.get("text")
        try:
            await self._upstream.send(Message(text=text) if text is not None else Message(data=message.get("bytes") or b""))
        except (ConnectionError, RuntimeError):
            pass  # the model server is gone: its side ends the connection

    async def websocket_disconnect(self, message):
        self._client_close_code = message.get("code")
        if self._job is not None and not self._job.done():
            if not self._closing_upstream:  # else a cut is closing it already: let that finish
                self._job.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._job
        elif self._upstream is not None:
            await self._upstream.close(self._upstream_close_code())
        raise StopConsumer()

    def _upstream_close_code(self) -> int:
        """The client's close code, passed on where the model server may be sent it."""
        code = self._client_close_code or NO_STATUS
        return code if code in (NORMAL_CLOSURE, NO_STATUS) or 3000 <= code <= 4999 else NORMAL_CLOSURE

    async def _close_upstream(self) -> None:
        """Close the model server's side, with the client's code if it left, waiting for the server's answer.
        The relay's read was cancelled first, so nothing else reads meanwhile."""
        self._closing_upstream = True
        if self._upstream is not None:
            await self._upstream.close(self._upstream_close_code(), wait_s=UPSTREAM_CLOSE_WAIT_S)

    async def _run(self) -> None:
        watch = None
        try:
            await self._admit()
            watch = asyncio.get_running_loop().create_task(self._end_when_refused(self._caller.scope.name))
            await self._serve()
        except ProxyError as exc:  # refused at the door (no row): counted for a row key's usage page
            if self._caller.scope.name:
                KEYS.refused(self._caller.scope.name, exc.status)
            await self._refuse(exc.status, exc.message)
        except Refused as exc:
            await self._refuse(exc.status, self._caller.scope.told(exc.message))
        except UpstreamRefused as exc:
            await self._refuse(502, f"{exc}: {exc.body[:200].decode('utf-8', 'replace')}")
        except (OSError, TimeoutError) as exc:
            await self._refuse(502, f"the model server could not be reached: {exc}")
        except ProtocolViolation as exc:
            await self._refuse(502, f"the model server broke the WebSocket protocol: {exc}")
        except asyncio.CancelledError:
            if self._revoked is None or asyncio.current_task().uncancel():
                raise  # the client left
            await self._refuse(self._revoked.status, self._revoked.message)
        except Exception:
            log.exception("unexpected failure in the WebSocket on %s", self.scope.get("path"))
            await self._refuse(500, "llamaswap hit an unexpected error; see its log")
        finally:
            if watch is not None:
                watch.cancel()
            if self._upstream is not None:
                await self._upstream.close(NORMAL_CLOSURE)

    def _headers(self) -> dict[str, str]:
        return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in reversed(self.scope.get("headers", []))}

    async def _admit(self) -> None:
        """Know the caller (its key counts from here), then check that its Host, origin and kind allow a socket."""
        headers = self._headers()
        if "host" in headers and (refusal := host_refusal(headers["host"])):
            raise ProxyError(400, refusal, "host_not_allowed")
        caller = await caller_of(headers, get_service().config.api_keys)
        if isinstance(caller, Denied):
            raise refused(caller)
        self._caller = caller
        if refusal := cross_site_refusal(headers, caller):  # a socket reads back too
            raise ProxyError(403, refusal, CROSS_SITE_CODE)
        if denied := route_refusal(caller, Need.INFERENCE):
            raise refused(denied)

    async def _end_when_refused(self, name: str) -> None:
        """Cut the socket once its key stops counting: the lease's holder records the cut, `_run` closes with it.
        A socket still queued is refused by the scheduler (`queue_closed_when_revoked`), its row saying so; one
        granted meanwhile is cut once it holds its lease."""
        denied = await until_refused(name, lambda: self._model)
        self._revoked = Refused(denied.status, denied.code, denied.message)
        while self._queued:
            await asyncio.sleep(WATCH_S)
        if self._job is not None and not self._job.done() and not self._closing_upstream:
            self._job.cancel()

    async def _serve(self) -> None:
        service = get_service()
        headers = self._headers()
        model_cfg, path = self._target(service)
        if denied := model_refusal(self._caller, model_cfg.id):
            raise refused(denied)
        self._model = model_cfg.id  # from here its key's watch also looks at whether it may still use the model
        query = self.scope.get("query_string", b"").decode("latin-1")
        path += f"?{query}" if query else ""
        if model_cfg.ignore_websockets:
            if not await is_ready(service, model_cfg.id):
                raise not_loaded(model_cfg.id, "its WebSockets (compat.ignoreWebsockets) never start it")
            await self._relay(service, model_cfg, model_cfg.proxy, path)
            return
        await self._relay_scheduled(service, model_cfg, path, headers)

    def _target(self, service):
        """(model config, path to open on its server) from the socket's path."""
        raw = (self.scope.get("raw_path") or self.scope["path"].encode()).decode("latin-1").split("?", 1)[0]
        if raw.startswith(COMFYUI_PREFIX):
            return comfyui_model(service), comfyui_rest(self.scope) or "/"
        if not raw.startswith(UPSTREAM_PREFIX):
            raise ProxyError(
                404, f"no WebSocket at {raw}: they pass through on /upstream/<model>/<path> and /comfyui/<path>",
                "route_not_found",
            )
        model_cfg, remainder = service.resolve_upstream_path(raw[len(UPSTREAM_PREFIX):], self._caller.scope)
        if remainder is not None and climbs_out(remainder):
            raise ProxyError(400, f"{raw}: '..' path segments are not forwarded", "invalid_path")
        return model_cfg, "/" + (remainder or "")

    async def _relay_scheduled(self, service, model_cfg, path: str, headers: dict[str, str]) -> None:
        """Hold a lease for the socket's whole life, as llama-swap counts an open socket as in flight."""
        door = service.door
        loop = asyncio.get_running_loop()
        self._queued = True
        try:
            async with queue_closed_when_revoked(door, self._caller.scope.name):
                lease = await door.submit(ticket_request(self.scope, headers, model=model_cfg.id,
                                                         requested=model_cfg.id, method="GET", key=self._caller.scope))
        finally:
            self._queued = False

        def left() -> Outcome:
            """The client closed its end: a socket's normal end, unless daphne closed it over its size limit."""
            if self._client_close_code == MESSAGE_TOO_BIG:
                return Outcome(
                    state=RequestState.FAILED, status_code=413,
                    error=f"the client sent a message over the {service.config.max_request_body_bytes}-byte limit "
                          "(maxRequestBodyBytes); the socket was closed with 1009",
                )
            return Outcome(state=RequestState.COMPLETED, status_code=101)

        async with holding(lambda outcome: door.release(lease.ticket_id, stamped(outcome, loop.time())),
                           lambda: lease.cut or self._revoked,
                           failures=(UpstreamRefused, OSError, TimeoutError, ProtocolViolation), left=left) as held:
            lease.held_by(asyncio.current_task())
            try:
                ended = await self._relay(service, model_cfg, lease.upstream, path)
            except asyncio.CancelledError:  # cut, or the client left: the lease goes once the model has closed its side
                await self._close_upstream()
                raise
            # A model that dropped the socket: the client was told 4502; the row says why, as for a request cut mid-stream.
            held.end(Outcome(state=RequestState.COMPLETED, status_code=101) if ended.clean else Outcome(
                state=RequestState.FAILED, status_code=502,
                error=f"model '{model_cfg.id}' dropped the WebSocket without closing it: {ended.reason}",
            ))
        if held.cut is not None:
            await self._refuse(held.cut.status, self._caller.scope.told(held.cut.message))

    async def _relay(self, service, model_cfg, base_url: str, path: str) -> Closed:
        """Pass frames both ways until the model server's side ends; that end is returned."""
        drop = CREDENTIAL_HEADERS if self._caller.keyed else frozenset()
        forwarded = without_own_cookies([
            (k.decode("latin-1"), v.decode("latin-1")) for k, v in self.scope.get("headers", [])
            if k.decode("latin-1").lower() not in drop
        ])
        self._upstream = await connect(
            base_url, path, forwarded, list(self.scope.get("subprotocols") or []), model_cfg.timeouts.connect,
        )
        self._accepted = True
        await self.send({"type": "websocket.accept", "subprotocol": self._upstream.subprotocol})
        while True:
            message = await self._upstream.receive()
            if isinstance(message, Closed):
                await self.send({"type": "websocket.close", "code": client_close_code(message), "reason": message.reason})
                return message
            if message.text is not None:
                await self.send({"type": "websocket.send", "text": message.text})
            else:
                await self.send({"type": "websocket.send", "bytes": message.data})

    async def _refuse(self, status: int, message: str) -> None:
        log.info("WebSocket %s refused (%d): %s", self.scope.get("path"), status, message)
        if not self._accepted:
            self._accepted = True
            await self.send({"type": "websocket.accept"})
        await self.send({"type": "websocket.close", "code": refusal_code(status), "reason": message})
