"""Requests sent straight into the ASGI application, as daphne would deliver them, and what they left behind."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

from channels.testing import ApplicationCommunicator

from tests.served import fake_cmd, model_ports

# Every request waits at most this long for its answer: a hang fails the test instead of stalling it.
ANSWER_TIMEOUT = 15.0
# The model's base URL has a path, so a test can tell whether a request stayed below it.
BASE_PATH = "/base"
# maxRequestBodyBytes of the in-process service.
BODY_LIMIT = 64 * 1024


@dataclass
class Answer:
    status: int
    headers: dict[bytes, bytes]
    body: bytes

    def json(self):
        return json.loads(self.body)

    def error_message(self) -> str:
        """The OpenAI-shaped error's message; fails the test when the answer is not such an error."""
        assert self.headers.get(b"content-type", b"").startswith(b"application/json"), (self.status, self.body[:300])
        payload = self.json()
        message = payload["error"]["message"]
        assert isinstance(message, str) and message, payload
        return message


class InProcess:
    """Sends one request at a time through `llamaswap_site.asgi.application`, as daphne would deliver it."""

    def __init__(self, service, events: Path):
        self.service = service
        self.events = events  # the fake model server's record of what reached it

    async def request(self, method: str, raw_path: str | bytes, body: bytes | list[bytes] = b"",
                      headers: list[tuple[bytes, bytes]] | None = None, *, host: bytes | None = b"127.0.0.1") -> Answer:
        """One request; a list body arrives in that many pieces, as a large upload does."""
        from llamaswap_site.asgi import application

        raw = raw_path.encode("latin-1") if isinstance(raw_path, str) else raw_path
        target, _, query = raw.partition(b"?")
        sent = list(headers or [])
        if host is not None:
            sent.insert(0, (b"host", host))
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "scheme": "http",
            "method": method,
            "path": unquote(target.decode("latin-1")),
            "raw_path": target,
            "query_string": query,
            "headers": sent,
            "client": ("127.0.0.1", 50000),
            "server": ("127.0.0.1", 8080),
        }
        communicator = ApplicationCommunicator(application, scope)
        try:
            pieces = body if isinstance(body, list) else [body]
            for i, piece in enumerate(pieces):
                await communicator.send_input({"type": "http.request", "body": piece, "more_body": i < len(pieces) - 1})
            start = await communicator.receive_output(ANSWER_TIMEOUT)
            assert start["type"] == "http.response.start", start
            chunks = []
            while True:
                message = await communicator.receive_output(ANSWER_TIMEOUT)
                chunks.append(message.get("body", b""))
                if not message.get("more_body"):
                    break
            await communicator.send_input({"type": "http.disconnect"})
            await communicator.wait(ANSWER_TIMEOUT)
        finally:
            communicator.stop(exceptions=False)
        headers = {name.lower(): value for name, value in start.get("headers", [])}
        return Answer(start["status"], headers, b"".join(chunks))

    async def chat(self, model: str = "m", headers: list[tuple[bytes, bytes]] | None = None) -> Answer:
        """An ordinary chat completion, the request every hostile one must leave working.

        Below the base path the fake model server echoes what reached it instead of completing.
        """
        body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}]}).encode()
        return await self.request(
            "POST", "/v1/chat/completions", body, [(b"content-type", b"application/json"), *(headers or [])]
        )

    async def last_row(self):
        """The newest request row, once the recorder has written everything so far."""
        from scheduling.models import QueuedRequest

        def read():
            assert self.service.recorder.flush(ANSWER_TIMEOUT), "the recorder did not catch up"
            return QueuedRequest.objects.order_by("-id").first()

        return await asyncio.to_thread(read)


def inprocess_config(tmp_path: Path, events: Path):
    """One model, `m` (alias `m-alias`), served by the fake model server below BASE_PATH."""
    from proxy.config import parse_config

    text = f"""
startPort: {model_ports(4)}
maxRequestBodyBytes: {BODY_LIMIT}
models:
  m:
    cmd: {fake_cmd("m", events, "--tps", "0", "--tokens", "4")}
    proxy: http://127.0.0.1:${{PORT}}{BASE_PATH}
    aliases: [m-alias]
routing:
  scheduler:
    use: serial
"""
    return parse_config(text, str(tmp_path / "config.yaml"))
