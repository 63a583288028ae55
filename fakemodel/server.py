"""A stand-in for llama-server: an OpenAI-compatible model server that generates fake words.

Tests, benchmarks and the demo config run it as the upstream so the proxy can be exercised
without a GPU. It imports only the standard library so it starts in a few tens of milliseconds.

    python -m fakemodel --port 8081 --model demo --tps 20

Every response is written in as few socket writes as possible and Nagle is disabled: a stdlib
server that writes headers and body separately makes each httpx request stall ~40 ms on delayed
ACKs, which would make every latency figure measured through it fiction.

Per-request behaviour can be changed with the JSON body key ``"fake"``:
``{"tokens": n, "tps": x, "crash_after": n, "delay": s, "status": code, "id": str}``.
``id`` names the request in the ``--events`` file (default: its arrival number, "1", "2"…).
A POST to any other path (``/v1/rerank``…) is answered with what reached the server, its JSON
body included, so tests can check what the proxy forwarded.

``--events FILE`` gets one JSON line per request "start", "end" or "disconnect" (not for
``GET /health``); "end" is written just before the response's last bytes, so a client that has
read a whole response always finds it. "start" carries ``in_flight``, the number of requests
being served at that moment, itself included.

``GET /health``, the echo answers and each "start" event carry ``cuda_visible_devices``: the
``CUDA_VISIBLE_DEVICES`` the server was started with (null when it had none), so tests can see
which GPUs placement gave it.

``--parallel N`` serves at most N requests at once, as llama-server does with ``-np N``: the
others wait in arrival order for a free slot (a "queued" event records each one that has to),
and one whose client leaves while it waits is dropped. GET requests never take a slot. Without
it every request is served at once.

``--gpu-memory MIB`` makes the server "use" MIB of GPU memory on each GPU of its ``CUDA_VISIBLE_DEVICES``
(GPU 0 without one), for the fake ``nvidia-smi`` (``fakemodel.nvidia_smi``) to report: it writes
``<pid>.json`` into the directory ``LLAMASWAP_FAKE_GPU_DIR`` names.

A GET with ``Upgrade: websocket`` on any path opens an echo WebSocket (see ``_websocket_echo``), for
the passthrough's tests; its events are "websocket" lines with ``state`` "open" or "closed".
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import select
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from collections import deque
from contextlib import contextmanager
from typing import Any, Callable, Iterator
from urllib.parse import parse_qs

from proxy.websockets import frames as wsf

WORDS = (
    "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike "
    "november oscar papa quebec romeo sierra tango uniform victor whiskey xray yankee zulu"
).split()

# Fake prompt processing speed, reported in llama.cpp-style timings (nothing actually waits for it).
PROMPT_TOKENS_PER_SECOND = 2000.0
EMBEDDING_DIMENSIONS = 16
CRASH_EXIT_STATUS = 3
GPU_DIR_VARIABLE = "LLAMASWAP_FAKE_GPU_DIR"  # where --gpu-memory is written for the fake nvidia-smi

ERROR_TYPES = {
    400: ("invalid_request_error", "bad_request"),
    401: ("authentication_error", "invalid_api_key"),
    403: ("permission_error", "forbidden"),
    404: ("invalid_request_error", "not_found"),
    429: ("rate_limit_error", "rate_limit_exceeded"),
}


class ClientGone(Exception):
    """The client closed its connection while we were still answering."""


@dataclass(frozen=True)
class Behaviour:
    """How the server behaves, from the command line."""

    model: str = "fake"
    tps: float = 50.0
    tokens: int = 16
    crash_after_tokens: int | None = None
    usage_when_asked: bool = False  # a stream's usage only with stream_options.include_usage, as OpenAI and vLLM do


@dataclass(frozen=True)
class Generation:
    """One request's generation parameters after applying the body's overrides."""

    tokens: int
    tps: float
    crash_after: int | None
    prompt_tokens: int


class EventLog:
    """Appends one JSON line per request event so tests can see what reached the upstream."""

    def __init__(self, path: str | None):
        self._file = open(path, "a", encoding="utf-8") if path else None
        self._lock = threading.Lock()

    def record(self, event: str, **fields: Any) -> None:
        if self._file is None:
            return
        line = json.dumps({"event": event, "t": time.time(), **fields})
        with self._lock:
            self._file.write(line + "\n")
            self._file.flush()


class Slots:
    """At most `limit` holders at a time (0: no limit), granted in arrival order like llama-server's task queue.

    A plain semaphore does not promise first-come first-served among waiting threads; this does."""

    # How often a waiting request checks whether its client is still there.
    POLL_S = 0.05

    def __init__(self, limit: int):
        self.limit = limit
        self._changed = threading.Condition()
        self._waiting: deque[object] = deque()
        self.in_flight = 0

    def _free_for(self, ticket: object) -> bool:
        return (self.limit == 0 or self.in_flight < self.limit) and self._waiting[0] is ticket

    @contextmanager
    def held(self, on_wait: Callable[[int], None], client_gone: Callable[[], bool]) -> Iterator[int]:
        """Hold a slot for the block, yielding the number in flight; ClientGone if the client leaves first."""
        ticket = object()
        with self._changed:
            self._waiting.append(ticket)
            if not self._free_for(ticket):
                on_wait(self.in_flight)
            while not self._free_for(ticket):
                self._changed.wait(self.POLL_S)
                if client_gone():
                    self._waiting.remove(ticket)
                    self._changed.notify_all()
                    raise ClientGone
            self._waiting.popleft()
            self.in_flight += 1
            in_flight = self.in_flight
            self._changed.notify_all()
        try:
            yield in_flight
        finally:
            with self._changed:
                self.in_flight -= 1
                self._changed.notify_all()


class FakeModelServer(ThreadingHTTPServer):
    """Holds the behaviour and the loading state shared by all request threads."""

    daemon_threads = True
    # Like a real model server, accept a burst of connections (the stdlib default is 5).
    request_queue_size = 1024

    def __init__(self, address: tuple[str, int], behaviour: Behaviour, events: EventLog, parallel: int = 0):
        super().__init__(address, FakeModelHandler)
        self.behaviour = behaviour
        self.events = events
        self.slots = Slots(parallel)
        self.loaded = threading.Event()
        self.cuda_visible_devices = os.environ.get("CUDA_VISIBLE_DEVICES")
        self._sequence = 0
        self._sequence_lock = threading.Lock()

    def next_request_id(self) -> str:
        with self._sequence_lock:
            self._sequence += 1
            return str(self._sequence)


def token_text(index: int) -> str:
    """The index-th generated word; the concatenation of all tokens is the completion text."""
    word = WORDS[index % len(WORDS)]
    return word if index == 0 else " " + word


def count_words(value: Any) -> int:
    """A rough token count of a prompt: the number of whitespace-separated words in its strings."""
    if isinstance(value, str):
        return len(value.split())
    if isinstance(value, list):
        return sum(count_words(item) for item in value)
    if isinstance(value, dict):
        return sum(count_words(item) for key, item in value.items() if key in ("content", "text"))
    return 0


def prompt_of(body: dict[str, Any]) -> Any:
    if "messages" in body:
        return body["messages"]
    return body.get("prompt", body.get("input", ""))


def timings(generation: Generation, predicted_seconds: float) -> dict[str, float]:
    """llama.cpp's `timings` object, which the proxy turns into speed metrics."""
    prompt_ms = generation.prompt_tokens / PROMPT_TOKENS_PER_SECOND * 1000.0
    predicted_ms = predicted_seconds * 1000.0
    return {
        "prompt_n": generation.prompt_tokens,
        "prompt_ms": prompt_ms,
        "prompt_per_second": PROMPT_TOKENS_PER_SECOND,
        "predicted_n": generation.tokens,
        "predicted_ms": predicted_ms,
        "predicted_per_second": generation.tokens / predicted_seconds if predicted_seconds > 0 else 0.0,
    }


def usage(generation: Generation) -> dict[str, int]:
    return {
        "prompt_tokens": generation.prompt_tokens,
        "completion_tokens": generation.tokens,
        "total_tokens": generation.prompt_tokens + generation.tokens,
    }


def embedding(text: str) -> list[float]:
    """A deterministic unit vector derived from the text."""
    digest = hashlib.sha256(text.encode("utf-8")).digest()
    raw = [(byte - 127.5) / 127.5 for byte in digest[:EMBEDDING_DIMENSIONS]]
    norm = math.sqrt(sum(x * x for x in raw)) or 1.0
    return [x / norm for x in raw]


def error_body(status: int, message: str) -> dict[str, Any]:
    generic = ("invalid_request_error", "bad_request") if status < 500 else ("server_error", "server_error")
    error_type, code = ERROR_TYPES.get(status, generic)
    return {"error": {"message": message, "type": error_type, "code": code}}


def sse(payload: Any) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload)
    return f"data: {data}\n\n".encode("utf-8")


def http_chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def crash(tokens_sent: int) -> None:
    """Die the way a model server does when it segfaults: no cleanup, no response."""
    sys.stderr.write(f"fakemodel: crashing after {tokens_sent} tokens as requested\n")
    sys.stderr.flush()
    os._exit(CRASH_EXIT_STATUS)


class FakeModelHandler(BaseHTTPRequestHandler):
    """Answers one connection's requests; streaming answers watch the socket for a departed client."""

    server: FakeModelServer
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    server_version = "fakemodel"
    # The request's event fields until its "end" is recorded.
    _pending_end: dict[str, Any] | None = None

    # -- plumbing ---------------------------------------------------------------------------

    def _header_block(self, status: int, headers: dict[str, str]) -> bytes:
        try:
            reason = HTTPStatus(status).phrase
        except ValueError:
            reason = ""
        lines = [f"HTTP/1.1 {status} {reason}", "Server: fakemodel"]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        if self.close_connection:
            lines.append("Connection: close")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    def _respond(self, status: int, payload: Any) -> None:
        body = json.dumps(payload).encode("utf-8")
        headers = {"Content-Type": "application/json", "Content-Length": str(len(body))}
        self._record_end()
        self.wfile.write(self._header_block(status, headers) + body)
        self.log_request(status)

    def _respond_error(self, status: int, message: str) -> None:
        self._respond(status, error_body(status, message))

    def _record_end(self) -> None:
        """Record "end" just before the last bytes go out, so a client that read them finds it."""
        if self._pending_end is not None:
            self.server.events.record("end", **self._pending_end)
            self._pending_end = None

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            parts = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(parts)
                parts.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _client_gone(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds; True as soon as the client has closed its end."""
        readable, _, _ = select.select([self.connection], [], [], max(timeout, 0.0))
        if not readable:
            return False
        try:
            peeked = self.connection.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except BlockingIOError:
            return False
        except OSError:
            return True
        if peeked:
            # A pipelined next request, not a hang-up: just let the rest of the wait pass.
            time.sleep(max(timeout, 0.0))
            return False
        return True

    def _pace(self, generation: Generation) -> Iterator[str]:
        """Yield the tokens at the requested rate, stopping early if the client leaves."""
        started = time.monotonic()
        for index in range(generation.tokens):
            if generation.crash_after is not None and index >= generation.crash_after:
                crash(index)
            due = started + index / generation.tps if generation.tps > 0 else started
            if self._client_gone(due - time.monotonic()):
                raise ClientGone
            yield token_text(index)
        if generation.crash_after is not None and generation.tokens >= generation.crash_after:
            crash(generation.tokens)

    def _generation(self, body: dict[str, Any], fake: dict[str, Any]) -> Generation:
        behaviour = self.server.behaviour
        tokens = fake.get("tokens", body.get("max_tokens", body.get("n_predict", behaviour.tokens)))
        if tokens is None or int(tokens) < 0:  # llama.cpp's n_predict -1 means "no limit"
            tokens = behaviour.tokens
        crash_after = fake.get("crash_after", behaviour.crash_after_tokens)
        return Generation(
            tokens=int(tokens),
            tps=float(fake.get("tps", behaviour.tps)),
            crash_after=None if crash_after is None else int(crash_after),
            prompt_tokens=count_words(prompt_of(body)),
        )

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        sys.stderr.write(f"fakemodel: {self.address_string()} {format % args}\n")

    # -- dispatch ---------------------------------------------------------------------------

    def do_GET(self) -> None:
        self._read_body()  # a body on a GET must not be left to corrupt the next request on this connection
        path = self.path.split("?", 1)[0]
        if self.headers.get("Upgrade", "").lower() == "websocket":
            self._websocket_echo()
            return
        if path == "/health":
            devices = {"cuda_visible_devices": self.server.cuda_visible_devices}
            if self.server.loaded.is_set():
                self._respond(200, {"status": "ok", **devices})
            else:
                self._respond(503, {"status": "loading", **devices})
            return
        self._handle(body={})

    def do_PUT(self) -> None:
        self.do_POST()

    def do_PATCH(self) -> None:
        self.do_POST()

    def do_DELETE(self) -> None:
        self.do_POST()

    def do_POST(self) -> None:
        raw = self._read_body()
        content_type = self.headers.get("Content-Type", "")
        if content_type.startswith("multipart/form-data"):
            self._handle(body=self._form_fields(raw, content_type))
            return
        try:
            body = json.loads(raw) if raw.strip() else {}
        except ValueError as exc:
            self._respond_error(400, f"request body is not valid JSON: {exc}")
            return
        if not isinstance(body, dict):
            self._respond_error(400, "request body must be a JSON object")
            return
        self._handle(body=body)

    def _handle(self, body: dict[str, Any]) -> None:
        fake = body.get("fake") if isinstance(body.get("fake"), dict) else {}
        arrival = self.server.next_request_id()
        request_id = str(fake.get("id") or arrival)
        event = {
            "id": request_id,
            "path": self.path,
            "model": body.get("model"),
            "priority": self.headers.get("X-LlamaSwap-Priority"),
            "headers": {name.lower(): value for name, value in self.headers.items()},
        }
        try:
            if self.command == "GET":
                self._serve(body, fake, event, in_flight=None)
                return

            def queued(in_flight: int) -> None:
                self.server.events.record("queued", in_flight=in_flight, **event)

            with self.server.slots.held(queued, lambda: self._client_gone(0)) as in_flight:
                self._serve(body, fake, event, in_flight)
        except (ClientGone, BrokenPipeError, ConnectionResetError):
            self.close_connection = True
            self._pending_end = None
            self.server.events.record("disconnect", **event)

    def _serve(self, body: dict[str, Any], fake: dict[str, Any], event: dict[str, Any], in_flight: int | None) -> None:
        """Answer the request, which holds a slot if it needs one (`in_flight` counts it)."""
        self.server.events.record(
            "start", in_flight=in_flight, cuda_visible_devices=self.server.cuda_visible_devices, **event
        )
        self._pending_end = event
        self.server.loaded.wait()
        try:
            delay = float(fake.get("delay") or 0)
            status = int(fake.get("status") or 0)
            generation = self._generation(body, fake)
        except (TypeError, ValueError) as exc:
            self._respond_error(400, f"invalid request parameter: {exc}")
            return
        if delay and self._client_gone(delay):
            raise ClientGone
        if status:
            self._respond_error(status, f"fake error {status} requested by the client")
        else:
            self._route(body, generation)

    def _route(self, body: dict[str, Any], generation: Generation) -> None:
        path, _, query = self.path.partition("?")
        if self.command == "GET":
            if path == "/v1/models":
                self._respond(200, self._models())
            else:
                self._respond(200, self._echo(parse_qs(query).get("model", [None])[0]))
            return
        stream = bool(body.get("stream"))
        if path in ("/v1/chat/completions", "/v1/completions"):
            chat = path == "/v1/chat/completions"
            if stream:
                self._stream_openai(generation, chat, self._streams_usage(body))
            else:
                self._complete_openai(generation, chat)
        elif path in ("/completion", "/infill"):
            if stream:
                self._stream_native(generation)
            else:
                self._complete_native(generation)
        elif path == "/v1/embeddings":
            self._respond(200, self._embeddings(body))
        elif path == "/v1/audio/transcriptions":
            echo = {"text": "fake transcription", "model": body.get("model"), "file_size": body.get("file_size", 0)}
            self._respond(200, echo)
        else:
            self._respond(200, {**self._echo(body.get("model")), "body": body})

    # -- endpoints --------------------------------------------------------------------------

    def _websocket_echo(self) -> None:
        """Any GET upgrade: echo each message back; the text "whoami" gets the path it was opened on, and
        "close-me" a close with code 4321; after "close-slowly" (echoed) the server takes 0.5 s to answer the
        client's close, as a busy model server may. "websocket" events record the open and the close."""
        protocols = [p.strip() for p in self.headers.get("Sec-WebSocket-Protocol", "").split(",") if p.strip()]
        headers = {"Upgrade": "websocket", "Connection": "Upgrade",
                   "Sec-WebSocket-Accept": wsf.accept_key(self.headers.get("Sec-WebSocket-Key", ""))}
        if protocols:
            headers["Sec-WebSocket-Protocol"] = protocols[0]
        self.server.events.record("websocket", state="open", path=self.path)
        self.wfile.write(self._header_block(101, headers))
        self.close_connection = True  # after the head: its "Connection: close" would void the upgrade
        code = wsf.NO_STATUS
        close_delay_s = 0.0
        while True:
            head = self.rfile.read(2)
            if len(head) < 2:
                break
            _fin, opcode, masked, length = wsf.frame_header(head)
            if wsf.extended_length_size(length):
                length = wsf.extended_length(self.rfile.read(wsf.extended_length_size(length)))
            mask = self.rfile.read(4) if masked else b""
            payload = wsf.unmask(self.rfile.read(length), mask)
            if opcode == wsf.CLOSE:
                code = wsf.parse_close(payload)[0]
                time.sleep(close_delay_s)
                self.wfile.write(wsf.encode_frame(wsf.CLOSE, payload, masked=False))
                break
            if opcode == wsf.PING:
                self.wfile.write(wsf.encode_frame(wsf.PONG, payload, masked=False))
            elif payload == b"whoami":
                answer = json.dumps({"path": self.path, "served_by": self.server.behaviour.model}).encode()
                self.wfile.write(wsf.encode_frame(wsf.TEXT, answer, masked=False))
            elif payload == b"close-slowly":
                close_delay_s = 0.5
                self.wfile.write(wsf.encode_frame(wsf.TEXT, payload, masked=False))
            elif payload == b"close-me":
                self.wfile.write(wsf.encode_frame(wsf.CLOSE, wsf.close_payload(4321, "asked to"), masked=False))
            elif opcode in (wsf.TEXT, wsf.BINARY):
                self.wfile.write(wsf.encode_frame(opcode, payload, masked=False))
        self.server.events.record("websocket", state="closed", path=self.path, code=code)

    def _echo(self, requested_model: str | None) -> dict[str, Any]:
        """What reached this server, for checking the proxy's forwarding and routing."""
        return {
            "path": self.path,
            "method": self.command,
            "model": requested_model,
            "served_by": self.server.behaviour.model,
            "cuda_visible_devices": self.server.cuda_visible_devices,
        }

    def _models(self) -> dict[str, Any]:
        model = self.server.behaviour.model
        return {"object": "list", "data": [{"id": model, "object": "model", "created": 0, "owned_by": "fakemodel"}]}

    def _embeddings(self, body: dict[str, Any]) -> dict[str, Any]:
        inputs = body.get("input", "")
        texts = inputs if isinstance(inputs, list) else [inputs]
        prompt_tokens = count_words(texts)
        return {
            "object": "list",
            "model": self.server.behaviour.model,
            "data": [
                {"object": "embedding", "index": i, "embedding": embedding(str(text))} for i, text in enumerate(texts)
            ],
            "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
        }

    @staticmethod
    def _form_fields(raw: bytes, content_type: str) -> dict[str, Any]:
        """The text fields of a multipart form, plus the total size of its file parts."""
        from email.parser import BytesParser
        from email.policy import HTTP

        header = b"Content-Type: " + content_type.encode("latin-1") + b"\r\n\r\n"
        message = BytesParser(policy=HTTP).parsebytes(header + raw)
        fields: dict[str, Any] = {"file_size": 0}
        for part in message.iter_parts():
            payload = part.get_payload(decode=True) or b""
            name = part.get_param("name", header="content-disposition")
            if part.get_filename() is not None:
                fields["file_size"] += len(payload)
            elif name:
                fields[name] = payload.decode("utf-8", "replace")
        return fields

    def _complete_openai(self, generation: Generation, chat: bool) -> None:
        started = time.monotonic()
        text = "".join(self._pace(generation))
        choice: dict[str, Any] = {"index": 0, "finish_reason": "stop"}
        if chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice.update(text=text, logprobs=None)
        self._respond(
            200,
            {
                "id": f"cmpl-{os.getpid()}-{time.monotonic_ns()}",
                "object": "chat.completion" if chat else "text_completion",
                "created": int(time.time()),
                "model": self.server.behaviour.model,
                "choices": [choice],
                "usage": usage(generation),
                "timings": timings(generation, time.monotonic() - started),
            },
        )

    def _complete_native(self, generation: Generation) -> None:
        started = time.monotonic()
        text = "".join(self._pace(generation))
        self._respond(
            200,
            {
                "content": text,
                "stop": True,
                "model": self.server.behaviour.model,
                "tokens_predicted": generation.tokens,
                "tokens_evaluated": generation.prompt_tokens,
                "timings": timings(generation, time.monotonic() - started),
            },
        )

    def _streams_usage(self, body: dict[str, Any]) -> bool:
        """Whether a stream ends with its usage: always, as llama.cpp does, or with --usage-when-asked only when
        the body asks for it."""
        if not self.server.behaviour.usage_when_asked:
            return True
        options = body.get("stream_options")
        return isinstance(options, dict) and options.get("include_usage") is True

    def _stream_openai(self, generation: Generation, chat: bool, with_usage: bool) -> None:
        chunk_id = f"cmpl-{os.getpid()}-{time.monotonic_ns()}"
        base = {
            "id": chunk_id,
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": int(time.time()),
            "model": self.server.behaviour.model,
        }

        def event(choice: dict[str, Any], **extra: Any) -> bytes:
            return sse({**base, "choices": [{"index": 0, **choice}] if choice else [], **extra})

        def piece(token: str) -> dict[str, Any]:
            return {"delta": {"content": token}} if chat else {"text": token}

        started = time.monotonic()
        first = event({"delta": {"role": "assistant", "content": ""}, "finish_reason": None}) if chat else b""

        def final() -> list[bytes]:
            stop = {"delta": {}} if chat else {"text": ""}
            if not with_usage:
                return [event({**stop, "finish_reason": "stop"}), sse("[DONE]")]
            reported = {"usage": usage(generation)}
            if not self.server.behaviour.usage_when_asked:
                reported["timings"] = timings(generation, time.monotonic() - started)
            return [event({**stop, "finish_reason": "stop"}), event({}, **reported), sse("[DONE]")]

        self._stream(first, generation, lambda token: event({**piece(token), "finish_reason": None}), final)

    def _stream_native(self, generation: Generation) -> None:
        started = time.monotonic()

        def final() -> list[bytes]:
            return [
                sse(
                    {
                        "content": "",
                        "stop": True,
                        "model": self.server.behaviour.model,
                        "tokens_predicted": generation.tokens,
                        "tokens_evaluated": generation.prompt_tokens,
                        "timings": timings(generation, time.monotonic() - started),
                    }
                )
            ]

        self._stream(b"", generation, lambda token: sse({"content": token, "stop": False}), final)

    def _stream(
        self,
        first: bytes,
        generation: Generation,
        event_for_token: Callable[[str], bytes],
        final: Callable[[], list[bytes]],
    ) -> None:
        """Send an SSE response, chunked: headers with `first`, one event per token, then `final()`.

        The final events are built after generation so their timings are real."""
        headers = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "Transfer-Encoding": "chunked"}
        self.wfile.write(self._header_block(200, headers) + (http_chunk(first) if first else b""))
        for token in self._pace(generation):
            self.wfile.write(http_chunk(event_for_token(token)))
        closing = b"".join(http_chunk(event) for event in final()) + b"0\r\n\r\n"
        self._record_end()
        self.wfile.write(closing)
        self.log_request(200)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="fakemodel", description="A fake OpenAI-compatible model server.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True, help="0 picks a free port (printed on stdout)")
    parser.add_argument("--model", default="fake", help="model id reported by the server")
    parser.add_argument("--tps", type=float, default=50.0, help="tokens per second; 0 = as fast as possible")
    parser.add_argument("--tokens", type=int, default=16, help="default completion length in tokens")
    parser.add_argument("--load-delay", type=float, default=0.0, metavar="SECONDS", help="report 'loading' this long")
    parser.add_argument("--exit-at-start", type=int, metavar="CODE", help="exit with CODE before opening the port")
    parser.add_argument("--hang-at-start", action="store_true", help="open the port but never become healthy")
    parser.add_argument("--crash-after-tokens", type=int, metavar="N", help="exit abruptly after N tokens of a request")
    parser.add_argument("--ignore-sigterm", action="store_true", help="survive SIGTERM (only SIGKILL stops it)")
    parser.add_argument(
        "--parallel", type=int, default=0, metavar="N", help="serve at most N requests at once (0: no limit)"
    )
    parser.add_argument("--events", metavar="FILE", help="append one JSON line per request start/end/disconnect")
    parser.add_argument("--usage-when-asked", action="store_true",
                        help="end a stream with its usage only when stream_options.include_usage asks (as OpenAI and vLLM)")
    parser.add_argument("--gpu-memory", type=int, metavar="MIB", help="GPU memory to report as used (fake nvidia-smi)")
    return parser.parse_args(argv)


def announce_gpu_memory(mib: int) -> None:
    """Tell the fake nvidia-smi this process uses `mib` on each of its GPUs (see the module docstring)."""
    directory = os.environ.get(GPU_DIR_VARIABLE)
    if not directory:
        sys.stderr.write(f"fakemodel: --gpu-memory needs {GPU_DIR_VARIABLE}; no GPU memory is reported\n")
        return
    state = {"pid": os.getpid(), "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"), "mib": mib}
    path = os.path.join(directory, f"{os.getpid()}.json")
    with open(path + ".tmp", "w") as state_file:
        json.dump(state, state_file)
    os.replace(path + ".tmp", path)  # whole or absent to a reader


def install_sigterm_handler(ignore: bool) -> None:
    def on_sigterm(signum: int, frame: Any) -> None:
        if ignore:
            sys.stderr.write("fakemodel: ignoring SIGTERM\n")
            sys.stderr.flush()
            return
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, on_sigterm)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.parallel < 0:
        sys.stderr.write(f"fakemodel: --parallel must be 0 (no limit) or more, not {args.parallel}\n")
        return 2
    if args.exit_at_start is not None:
        sys.stderr.write(f"fakemodel: exiting at start with status {args.exit_at_start} as requested\n")
        sys.stderr.flush()
        return args.exit_at_start
    install_sigterm_handler(args.ignore_sigterm)
    if args.gpu_memory is not None:
        announce_gpu_memory(args.gpu_memory)
    behaviour = Behaviour(
        model=args.model, tps=args.tps, tokens=args.tokens, crash_after_tokens=args.crash_after_tokens,
        usage_when_asked=args.usage_when_asked,
    )
    try:
        server = FakeModelServer((args.host, args.port), behaviour, EventLog(args.events), args.parallel)
    except OSError as exc:
        sys.stderr.write(f"fakemodel: cannot listen on {args.host}:{args.port}: {exc.strerror}\n")
        return 1
    if not args.hang_at_start:
        if args.load_delay > 0:
            timer = threading.Timer(args.load_delay, server.loaded.set)
            timer.daemon = True
            timer.start()
        else:
            server.loaded.set()
    host, port = server.server_address[:2]
    print(f"fakemodel {args.model} listening on {host}:{port}", flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
