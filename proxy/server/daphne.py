"""daphne as `llamaswap serve` runs it: slow clients are timed out, bodies are left to the application, and
a failure to listen is kept so the command can exit non-zero.

Twisted's idle timeout restarts with every byte received, so a client that sends a header byte every few
seconds (slowloris), forever, would hold its connection forever. Here a request's head must be complete
within `client_timeout` seconds of the connection starting to wait for it; the idle timeout (the same
number of seconds) still guards request bodies and keep-alive gaps. Neither runs while a request is being
answered, so a client queued for hours and a stream that lasts hours are never cut.
"""

from __future__ import annotations

import contextlib
import functools
import io
import logging
import tempfile
from collections.abc import Callable
from http import HTTPStatus

from daphne.http_protocol import HTTPFactory, WebRequest
from daphne.server import Server
from daphne.ws_protocol import WebSocketFactory, WebSocketProtocol
from twisted.web import http

from proxy.server.body_limit import BodyLimit
from proxy.serving.disk_full import disk_full, is_disk_full
from proxy.serving.errors import ProxyError
from proxy.server.spooled_body import SpooledBody
from proxy.websockets.frames import MESSAGE_TOO_BIG

log = logging.getLogger("llamaswap.http")

# The body limit of a request, by its method and path.
BodyLimits = Callable[[bytes, bytes], BodyLimit]


class DeadlineChannel(http.HTTPChannel):
    """One client connection, whose request heads must arrive within `head_timeout` seconds."""

    head_timeout: float = 60.0
    _head_deadline = None

    def connectionMade(self):
        super().connectionMade()
        self._await_head()

    def allHeadersReceived(self):
        self._cancel_head_deadline()
        super().allHeadersReceived()

    def requestDone(self, request):
        # Before the base class: it may go straight on to parse a next request the client already sent.
        self._await_head()
        super().requestDone(request)

    def connectionLost(self, reason):
        self._cancel_head_deadline()
        super().connectionLost(reason)

    def _send100Continue(self):
        """A client waiting to be told to send its body (Expect: 100-continue) is told instead the refusal its head
        already earned, and the connection closes: it need not send gigabytes only to have them dropped."""
        refused = getattr(self.requests[-1], "refused", None) if self.requests else None
        if refused is None:
            return super()._send100Continue()
        body = refused.body()
        head = [f"HTTP/1.1 {refused.status} {HTTPStatus(refused.status).phrase}", "Connection: close",
                *(f"{name}: {value}" for name, value in _refusal_headers(refused, body))]
        self.transport.write("\r\n".join(head).encode("latin-1") + b"\r\n\r\n" + body)
        self.transport.loseConnection()

    def _await_head(self) -> None:
        self._cancel_head_deadline()
        self._head_deadline = self.callLater(self.head_timeout, self._head_too_slow)

    def _cancel_head_deadline(self) -> None:
        if self._head_deadline is not None and self._head_deadline.active():
            self._head_deadline.cancel()
        self._head_deadline = None

    def _head_too_slow(self) -> None:
        self._head_deadline = None
        log.debug("closing the connection from %s: no complete request within %gs", self.transport.getPeer(), self.head_timeout)
        self.timeoutConnection()


def _refusal_headers(refused: ProxyError, body: bytes) -> list[tuple[str, str]]:
    """The headers of a refusal the server answers itself, before or after the body it refused."""
    return [("Content-Type", "application/json"), ("Content-Length", str(len(body))), *refused.headers.items()]


class _Dropped(io.BytesIO):
    """Where the body of a request refused as it arrived goes: nowhere (not a file, not memory)."""

    def write(self, data) -> int:
        return len(data)


class PhrasedRequest(WebRequest):
    """daphne's request, whose status line has the standard reason phrase also for the codes Twisted
    does not name (429 Too Many Requests, 422, 451…) instead of "Unknown Status".

    A body over the factory's `body_limit(method, path)` is refused from its Content-Length, or once a chunked
    one passes the limit: Twisted would spool it whole to a file before the application saw it (a client could
    fill the disk with one request). The rest is read and dropped, so the client, which sends it all before it
    reads an answer, gets the error rather than a reset connection. A body the disk has no room for is answered
    the same way, 507 (`disk_full`), and what was spooled of it is let go."""

    refused: ProxyError | None = None  # the answer to a body refused as it arrived
    _limit: BodyLimit | None = None
    _received = 0

    def gotLength(self, length):
        self._limit = limit = self.channel.factory.body_limit(self.channel._command, self.channel._path)
        if length is None and limit.needs_length:
            self._refuse(limit.length_required())
        elif length is not None and length > limit.max_bytes:
            self._refuse(limit.over(length))
        else:
            try:
                super().gotLength(length)  # a body over 100 000 bytes, or chunked: a temporary file
            except OSError as exc:
                self._disk_full(exc)

    def handleContentChunk(self, data):
        self._received += len(data)
        if self.refused is None and self._limit is not None and self._received > self._limit.max_bytes:
            self._refuse(self._limit.over(None))
        try:
            self.content.write(data)
            self.content.flush()  # a full disk is met here, not at the end where Twisted rewinds the file
        except OSError as exc:
            self._disk_full(exc)

    def _disk_full(self, exc: OSError) -> None:
        """The body cannot be spooled: answered 507 once it has arrived (any other failure is raised)."""
        if not is_disk_full(exc):
            raise exc
        log.warning("%s %s answered 507: the disk is full spooling its body into %s (%s)",
                    self.channel._command.decode("latin-1"), self.channel._path.decode("latin-1"),
                    tempfile.gettempdir(), exc)
        self._refuse(disk_full("the request body"))

    def _refuse(self, error: ProxyError) -> None:
        """Answer `error` once the body has arrived; what was kept of the body goes (a temporary file's room with it)."""
        self.refused = error
        if self.content is not None:
            with contextlib.suppress(OSError):  # a full disk: the bytes still buffered cannot be written, nor need be
                self.content.close()
        self.content = _Dropped()

    def process(self):
        if self.refused is None:
            return super().process()
        body = self.refused.body()  # the whole body was read: the connection may serve another request
        headers = [(name.encode("latin-1"), value.encode("latin-1"))
                   for name, value in _refusal_headers(self.refused, body)]
        self.handle_reply({"type": "http.response.start", "status": self.refused.status, "headers": headers})
        self.handle_reply({"type": "http.response.body", "body": body})

    def finish(self):
        """A response that ends short of the Content-Length it declared (its model died mid-answer) closes its
        connection once what was written is sent: Twisted would keep it open, and the client would wait for
        bytes that never come until a timeout instead of seeing the body cut."""
        channel = getattr(self, "channel", None)  # gone once finished
        short = (not self.finished and self.method != b"HEAD" and self.code not in (204, 304)
                 and self._declared_length() > self.sentLength)
        super().finish()
        if short and channel is not None:
            channel.loseConnection()

    def _declared_length(self) -> int:
        values = self.responseHeaders.getRawHeaders(b"content-length") or []
        return int(values[0]) if values and values[0].isdigit() else -1

    def setResponseCode(self, code, message=None):
        if message is None and code not in http.RESPONSES:
            with contextlib.suppress(ValueError):  # a code no standard names keeps Twisted's fallback
                message = HTTPStatus(code).phrase.encode("ascii")
        super().setResponseCode(code, message)


class DeadlineHTTPFactory(HTTPFactory):
    """daphne's factory, building DeadlineChannels that leave form bodies alone; `body_limit(method, path)` is each
    request's body limit (`PhrasedRequest`)."""

    protocol = DeadlineChannel

    def __init__(self, server: Server, client_timeout: float,
                 body_limit: BodyLimits):
        super().__init__(server)
        self.timeOut = client_timeout
        self.body_limit = body_limit

    def log(self, request):
        """Twisted's access-log line, which daphne sends nowhere below verbosity 2 (where `llamaswap serve` runs it):
        then it is not formatted at all, where Twisted would format one line a request to be dropped."""
        if self.server.verbosity > 1:
            super().log(request)

    def buildProtocol(self, addr):
        channel = super().buildProtocol(addr)
        channel.head_timeout = self.timeOut
        # The application reads bodies itself; Twisted's own form parsing would run the email parser over
        # every multipart upload on the event loop (seconds for 30 MB), for a result nobody reads.
        channel.requestFactory = functools.partial(PhrasedRequest, parsePOSTFormSubmission=False)
        return channel


WEBSOCKET_HANDSHAKE_WAIT_S = 24 * 3600


class LimitedWebSocketProtocol(WebSocketProtocol):
    """daphne's socket, which tells the application (websocket.disconnect) that it was closed over a message too
    big: the code it would pass on is the one the client echoed, or 1006 when the client did not."""

    def onClose(self, wasClean, code, reason):
        if self.wasMaxMessagePayloadSizeExceeded or self.wasMaxFramePayloadSizeExceeded:
            code = MESSAGE_TOO_BIG
        super().onClose(wasClean, code, reason)


class LimitedWebSocketFactory(WebSocketFactory):
    """daphne's WebSocket factory, whose sockets take messages up to `message_limit()` bytes (read as each
    socket opens, so a reload's maxRequestBodyBytes applies to the sockets opened after it) and close a
    larger one with 1009 "message too big" instead of dropping the connection."""

    protocol = LimitedWebSocketProtocol

    def __init__(self, server_class, *args, message_limit: Callable[[], int], **kwargs):
        super().__init__(server_class, *args, **kwargs)
        self.message_limit = message_limit
        # Any protocol failure (a message too big among them) ends with a close frame that says why.
        self.setProtocolOptions(failByDrop=False)

    def buildProtocol(self, addr):
        limit = self.message_limit()
        # Each socket copies the factory's options when it opens (in makeConnection, after this).
        self.setProtocolOptions(maxMessagePayloadSize=limit, maxFramePayloadSize=limit)
        return super().buildProtocol(addr)


class LlamaswapServer(Server):
    """daphne's Server with DeadlineHTTPFactory and LimitedWebSocketFactory, remembering why it could not listen."""

    def __init__(self, application, *, client_timeout: float, message_limit: Callable[[], int],
                 body_limit: BodyLimits, **kwargs):
        self.client_timeout = client_timeout
        self.message_limit = message_limit
        self.body_limit = body_limit
        self.listen_failure: str | None = None
        # A WebSocket's handshake completes once its model is loaded: it may queue and wait for a load as
        # long as a request does, where daphne would drop it after 5 s (the opening handshake) or refuse
        # it after 20 s (the connect timeout).
        kwargs.setdefault("websocket_connect_timeout", WEBSOCKET_HANDSHAKE_WAIT_S)
        kwargs.setdefault("websocket_handshake_timeout", WEBSOCKET_HANDSHAKE_WAIT_S)
        super().__init__(application, **kwargs)

    @property
    def ws_factory(self) -> WebSocketFactory:
        return self._ws_factory

    @ws_factory.setter
    def ws_factory(self, stock: WebSocketFactory) -> None:
        # Server.run() builds its stock factory here, then sets its options (the limits are set per socket).
        self._ws_factory = LimitedWebSocketFactory(self, server=self.server_name, message_limit=self.message_limit)

    @property
    def http_factory(self) -> HTTPFactory:
        return self._http_factory

    @http_factory.setter
    def http_factory(self, stock: HTTPFactory) -> None:
        # Server.run() builds its stock factory here; connections get ours, which is the same plus the deadlines.
        self._http_factory = DeadlineHTTPFactory(self, self.client_timeout, self.body_limit)

    def create_application(self, protocol, scope):
        """daphne's, but a body Twisted spooled to a file reaches the application a piece at a time (`SpooledBody`)."""
        queue = super().create_application(protocol, scope)
        content = getattr(protocol, "content", None) if scope.get("type") == "http" else None
        return SpooledBody(queue, content) if queue is not None and SpooledBody.applies_to(content) else queue

    def listen_error(self, failure) -> None:
        error = getattr(failure.value, "socketError", failure.value)
        self.listen_failure = getattr(error, "strerror", None) or str(error)
        self.stop()
