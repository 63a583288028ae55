"""Request/response captures, as llama-swap's `captureBuffer` keeps them, for `GET /api/captures/<id>`.

Captures live in the memory of the process that relayed the request (in distributed mode, a front
end), never in the database. They are off unless `captureBuffer` is above 0: the total they may take
is that many MB, and the oldest are dropped first to make room. The bodies of exchanges still being
collected count too, so many long streams at once cannot each hold a buffer's worth. Credentials never
enter them: the headers that carry keys and cookies (Azure's `api-key` too) are stored as "[REDACTED]".
"""

from __future__ import annotations

import base64
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from proxy.serving.auth import SECRET_HEADERS
from scheduling.whole_numbers import whole_number

MB = 1024 * 1024
REDACTED = "[REDACTED]"
REQUEST_ID_HEADER = b"x-llamaswap-request-id"
# Why a capture is missing is remembered for this many ids, so a 404 can say it (evicted, too large).
_REASONS_KEPT = 10_000

# The parts of an exchange a capture keeps. Routes whose payloads are audio or images keep only what
# is small and readable, as in llama-swap; every other route keeps all four.
REQUEST_HEADERS, REQUEST_BODY, RESPONSE_HEADERS, RESPONSE_BODY = 1, 2, 4, 8
ALL_PARTS = REQUEST_HEADERS | REQUEST_BODY | RESPONSE_HEADERS | RESPONSE_BODY
PARTS_BY_PATH = {
    "/v1/audio/speech": REQUEST_HEADERS | REQUEST_BODY | RESPONSE_HEADERS,
    "/v1/audio/voices": REQUEST_HEADERS | RESPONSE_HEADERS | RESPONSE_BODY,
    "/v1/audio/transcriptions": REQUEST_HEADERS | RESPONSE_HEADERS | RESPONSE_BODY,
    "/v1/images/generations": REQUEST_HEADERS | REQUEST_BODY | RESPONSE_HEADERS,
    "/v1/images/edits": REQUEST_HEADERS | RESPONSE_HEADERS,
    "/sdapi/v1/txt2img": REQUEST_HEADERS | REQUEST_BODY | RESPONSE_HEADERS,
    "/sdapi/v1/img2img": REQUEST_HEADERS | RESPONSE_HEADERS,
}


def parts_for(path: str) -> int:
    """The parts kept for a request to `path` (the path the model is sent, query left out)."""
    return PARTS_BY_PATH.get(path.split("?", 1)[0], ALL_PARTS)


def redacted(headers: dict[str, str]) -> dict[str, str]:
    return {name: REDACTED if name.lower() in SECRET_HEADERS else value for name, value in headers.items()}


@dataclass(frozen=True)
class Capture:
    """One request and its response, in llama-swap's `ReqRespCapture` shape."""

    id: int
    req_path: str
    req_headers: dict[str, str]
    req_body: bytes | None
    resp_headers: dict[str, str] | None
    resp_body: bytes | None

    def size(self) -> int:
        """What the capture counts against the buffer: its bodies and header text, uncompressed."""
        headers = (self.req_headers, self.resp_headers or {})
        return (
            len(self.req_path)
            + len(self.req_body or b"")
            + len(self.resp_body or b"")
            + sum(len(k) + len(v) for h in headers for k, v in h.items())
        )

    def as_json(self) -> dict[str, Any]:
        """Bodies are base64, as llama-swap's JSON encodes its byte slices; a part not kept is null."""
        return {
            "id": self.id,
            "req_path": self.req_path,
            "req_headers": self.req_headers,
            "req_body": _base64(self.req_body),
            "resp_headers": self.resp_headers,
            "resp_body": _base64(self.resp_body),
        }


def _base64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode("ascii")


class CaptureStore:
    """The captures of this process, bounded in total size; the oldest go first.

    The bound covers what is stored and what recorders are still collecting (reserved chunk by chunk):
    a reservation first drops the oldest stored captures, and is refused once the exchanges being
    collected alone would pass it.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._captures: OrderedDict[int, Capture] = OrderedDict()
        self._sizes: dict[int, int] = {}
        self._total = 0
        self._collecting = 0
        self._limit = 0
        self._missing: OrderedDict[int, str] = OrderedDict()

    @property
    def limit_bytes(self) -> int:
        return self._limit

    def configure(self, megabytes: float) -> None:
        """Apply `captureBuffer`: a smaller buffer drops the oldest captures until the rest fit; 0 drops all."""
        with self._lock:
            self._limit = int(megabytes * MB)
            self._evict_to(self._limit - self._collecting)

    def reserve(self, size: int) -> bool:
        """Room for `size` more bytes of an exchange being collected; False when there is none."""
        with self._lock:
            if self._limit <= 0 or self._collecting + size > self._limit:
                return False
            self._evict_to(self._limit - self._collecting - size)
            self._collecting += size
            return True

    def release(self, size: int) -> None:
        """Give back bytes reserved for an exchange that will not be stored."""
        with self._lock:
            self._collecting -= size

    def add(self, capture: Capture, reserved: int = 0) -> bool:
        """Keep `capture` (its `reserved` bytes become stored ones), dropping older ones to make room;
        False when it does not fit beside the exchanges still being collected."""
        size = capture.size()
        with self._lock:
            self._collecting -= reserved
            if self._limit <= 0:
                return False
            if size > self._limit - self._collecting:
                self._refuse(capture.id, size)
                return False
            self._evict_to(self._limit - self._collecting - size)
            self._captures[capture.id] = capture
            self._sizes[capture.id] = size
            self._total += size
            self._missing.pop(capture.id, None)
            return True

    def refuse(self, capture_id: int, size: int) -> None:
        """Record that a capture of `size` bytes was not kept because it alone exceeds the buffer."""
        with self._lock:
            self._refuse(capture_id, size)

    def _refuse(self, capture_id: int, size: int) -> None:
        if size > self._limit:
            self._remember(capture_id, f"its capture (at least {size} bytes) was larger than captureBuffer ({self._limit} bytes)")
        else:
            self._remember(capture_id, f"its capture (at least {size} bytes) did not fit in captureBuffer ({self._limit} "
                                       "bytes) beside the other exchanges being captured at the time")

    def get(self, capture_id: int) -> Capture | None:
        with self._lock:
            return self._captures.get(capture_id)

    def has(self, capture_id: int) -> bool:
        return capture_id in self._captures

    def why_missing(self, capture_id: int) -> str:
        """Why there is no capture for `capture_id`, as far as this process can tell."""
        if self._limit <= 0:
            return "captures are off: set captureBuffer (MB) in the config to keep them"
        reason = self._missing.get(capture_id)
        if reason is not None:
            return f"no capture for request {capture_id}: {reason}"
        return (
            f"no capture for request {capture_id}: this process did not relay it since captures were turned on, "
            "or its client left before the request was sent"
        )

    def _evict_to(self, room: int) -> None:
        while self._captures and self._total > max(room, 0):
            old_id, _ = self._captures.popitem(last=False)
            self._total -= self._sizes.pop(old_id)
            self._remember(old_id, "evicted to make room for newer captures (captureBuffer is full)")

    def _remember(self, capture_id: int, reason: str) -> None:
        self._missing[capture_id] = reason
        while len(self._missing) > _REASONS_KEPT:
            self._missing.popitem(last=False)


STORE = CaptureStore()


class CaptureRecorder:
    """Collects one exchange while its response is sent, then hands it to the store.

    The response is taken as the client got it, loading-state text and error answers included.
    Every body byte is reserved in the store before it is kept; once the store has no room (the
    buffer is taken by this and other exchanges being collected), collecting stops and the capture
    is not kept.
    The request's id comes from its `X-LlamaSwap-Request-Id` response header, or is set once known.
    """

    def __init__(self, store: CaptureStore, path: str, parts: int, headers: dict[str, str], body: bytes) -> None:
        self.store = store
        self.path = path
        self.parts = parts
        self.request_headers = redacted(headers) if self.parts & REQUEST_HEADERS else {}
        self.request_body = body if self.parts & REQUEST_BODY else None
        self.ticket_id: int | None = None
        self.status: int | None = None
        self.response_headers: dict[str, str] | None = None
        self.chunks: list[bytes] = []
        self.collected = len(self.request_body or b"")
        self.reserved = 0
        self.too_large = False
        self.finished = False
        self._keep(self.collected)

    def response_started(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        self.status = status
        sent: dict[str, str] = {}
        for key, value in headers:
            name = key.decode("latin-1").lower()  # as the request's: HTTP/2 style, one spelling per name
            sent.setdefault(name, value.decode("latin-1"))
            if key.lower() == REQUEST_ID_HEADER and whole_number(value.decode("latin-1")) is not None:
                self.ticket_id = whole_number(value.decode("latin-1"))
        if self.parts & RESPONSE_HEADERS:
            self.response_headers = redacted(sent)

    def response_sent(self, data: bytes) -> None:
        if not self.parts & RESPONSE_BODY or self.too_large or self.finished:
            return
        self.collected += len(data)
        if data and self._keep(len(data)):
            self.chunks.append(data)

    def _keep(self, size: int) -> bool:
        """Reserve `size` bytes; without room, stop collecting and give back what this capture held."""
        if self.store.reserve(size):
            self.reserved += size
            return True
        self.too_large = True
        self.chunks, self.request_body = [], None
        self.store.release(self.reserved)
        self.reserved = 0
        return False

    def finish(self) -> None:
        """Store the capture (once): a request that got no id (refused before queueing) has none."""
        if self.finished:
            return
        self.finished = True
        if self.ticket_id is None or self.status is None or self.too_large:
            self.store.release(self.reserved)
            if self.ticket_id is not None and self.too_large:
                self.store.refuse(self.ticket_id, self.collected)
            return
        # As llama-swap: an answer other than 200 keeps its headers, not its body.
        keep_body = self.parts & RESPONSE_BODY and self.status == 200
        self.store.add(Capture(
            id=self.ticket_id,
            req_path=self.path,
            req_headers=self.request_headers,
            req_body=self.request_body,
            resp_headers=self.response_headers,
            resp_body=b"".join(self.chunks) if keep_body else None,
        ), reserved=self.reserved)


def begin_capture(path: str, forwarded_path: str, headers: dict[str, str], body: bytes) -> CaptureRecorder | None:
    """A recorder for a request to `path` (as the client named it; its parts are chosen by the path the
    model is sent) when `captureBuffer` is on, else None: nothing is collected. The service sizes the
    store (`STORE.configure`) when it starts and on every reload."""
    if STORE.limit_bytes <= 0:
        return None
    return CaptureRecorder(STORE, path, parts_for(forwarded_path), headers, body)
