"""The clients that reach the model servers: one keep-alive connection pool per model at a time.

Requests go through httpcore, the connection layer httpx is built on: the relay forwards raw
bytes and needs none of httpx's request building, redirects, auth or response decoding, whose
per-request and per-chunk layers cost more CPU than the HTTP/1.1 exchange itself.

Closing a client closes every connection in its pool, including those a
request is still reading from. So a client is never closed under a request: a
reload that replaces a model's process, or changes its timeouts, *retires* the
model's client — later requests get a new one built from the new config — and
the retired client is closed once the last request using it has ended.
"""

from __future__ import annotations

import asyncio
import socket

import anyio
import httpcore
import httpx
from httpcore import _synchronization

from proxy.upstream.sockets import AsyncioBackend

# Writes are small (a request body to a local server); a stuck write still ends.
WRITE_TIMEOUT_S = 60.0
MAX_KEEPALIVE = 64

# Every error httpcore raises for a request that could not be sent or answered.
UPSTREAM_ERRORS = (
    httpcore.TimeoutException, httpcore.NetworkError, httpcore.ProtocolError, httpcore.UnsupportedProtocol,
)


class UpstreamClient:
    """A model's connection pool and the timeouts its requests carry.

    It ignores HTTP_PROXY and friends: model servers are the machine's own (or the LAN's), and an
    environment set up for reaching the internet must not send their traffic through a proxy.
    """

    __slots__ = ("pool", "timeout", "extensions", "is_closed")

    def __init__(self, timeouts):
        # connect, and read = response header and gaps between chunks
        self.timeout = httpx.Timeout(
            connect=timeouts.connect, read=timeouts.response_header, write=WRITE_TIMEOUT_S, pool=None)
        self.extensions = {"timeout": self.timeout.as_dict()}
        self.pool = httpcore.AsyncConnectionPool(
            ssl_context=httpx.create_ssl_context(trust_env=False),
            max_connections=None,
            max_keepalive_connections=MAX_KEEPALIVE,
            keepalive_expiry=timeouts.idle_conn,
            socket_options=keepalive_options(timeouts.keepalive),
            network_backend=AsyncioBackend(tls_handshake_timeout=timeouts.tls_handshake),
        )
        self.is_closed = False

    async def aclose(self) -> None:
        self.is_closed = True
        await self.pool.aclose()


def _without_idle_turns() -> None:
    """httpcore's locks and events on asyncio are anyio's, whose uncontended `acquire()` and whose `wait()` on an
    event already set still yield to the event loop: three turns of the loop on every request (its connection's
    request lock, its state lock as it starts and as its response closes) and one on taking a pooled connection,
    each behind whatever else is ready. Here a free lock is taken (anyio's `fast_acquire`) and a set event passed
    without that turn; a lock that is held, or an event not yet set, still waits as before. An httpcore whose
    classes are shaped otherwise is left as it is: slower by those turns, never broken."""
    lock_setup = getattr(getattr(_synchronization, "AsyncLock", None), "setup", None)
    event_wait = getattr(getattr(_synchronization, "AsyncEvent", None), "wait", None)
    if lock_setup is None or event_wait is None or getattr(lock_setup, "without_idle_turns", False):
        return

    def setup(self) -> None:
        lock_setup(self)
        if self._backend == "asyncio" and _FAST_ACQUIRE:
            self._anyio_lock = anyio.Lock(fast_acquire=True)

    async def wait(self, timeout: float | None = None) -> None:
        if self._backend == "asyncio" and self._anyio_event.is_set():
            return
        await event_wait(self, timeout)

    setup.without_idle_turns = True
    _synchronization.AsyncLock.setup, _synchronization.AsyncEvent.wait = setup, wait


try:  # anyio 4.5 and later
    anyio.Lock(fast_acquire=True)
    _FAST_ACQUIRE = True
except TypeError:
    _FAST_ACQUIRE = False
_without_idle_turns()


def keepalive_options(interval: float | None) -> list[tuple[int, int, int]]:
    """TCP keepalive probes after `interval` idle seconds and every `interval` seconds after that, so
    a model server that vanished (a host that went down, a dropped route) is noticed even while a
    request waits for its answer; None leaves the system's default (no probes)."""
    if interval is None:
        return []
    seconds = max(1, round(interval))
    return [
        (socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1),
        (socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, seconds),
        (socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, seconds),
    ]


def build_client(timeouts) -> UpstreamClient:
    return UpstreamClient(timeouts)


class _Shared:
    """One client and how many requests are using it."""

    __slots__ = ("client", "users", "retired")

    def __init__(self, client: UpstreamClient):
        self.client = client
        self.users = 0
        self.retired = False


class ClientUse:
    """`async with` one request's use of a model's client; leaving it may close a retired client."""

    __slots__ = ("_pool", "_shared")

    def __init__(self, pool: UpstreamClients, shared: _Shared):
        self._pool = pool
        self._shared = shared

    async def __aenter__(self) -> UpstreamClient:
        self._shared.users += 1
        return self._shared.client

    async def __aexit__(self, *exc) -> None:
        shared = self._shared
        shared.users -= 1
        if shared.retired and not shared.users:
            self._pool._close_later(shared.client)


class UpstreamClients:
    def __init__(self) -> None:
        self._current: dict[str, _Shared] = {}
        self._closing: set[asyncio.Task] = set()

    def use(self, model: str, timeouts) -> ClientUse:
        """The model's current client for one request (built with `timeouts` if it has none yet)."""
        shared = self._current.get(model)
        if shared is None:
            shared = self._current[model] = _Shared(build_client(timeouts))
        return ClientUse(self, shared)

    def retire(self, model: str) -> None:
        """The next request for `model` gets a new client; the old one closes when its last user leaves."""
        shared = self._current.pop(model, None)
        if shared is None:
            return
        shared.retired = True
        if not shared.users:
            self._close_later(shared.client)

    def _close_later(self, client: UpstreamClient) -> None:
        task = asyncio.get_running_loop().create_task(client.aclose())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def aclose(self) -> None:
        """Close every client, current or retired (at shutdown, once requests have drained)."""
        clients = [shared.client for shared in self._current.values()]
        self._current.clear()
        await asyncio.gather(*(c.aclose() for c in clients), *self._closing, return_exceptions=True)
