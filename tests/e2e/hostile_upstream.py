"""A model server (or peer) that answers JSON nested too deeply for Python's json module to read.

`python -m tests.e2e.hostile_upstream --port N`. The request body's `"hostile"` says how it answers:
`json` (200), `error` (500), `sse` (200, a stream whose last event is the nested one), or `short` (200 declaring
a Content-Length, then the connection closed before the body is whole, as a model that dies mid-answer), or
`both` (200 with a Content-Length and a chunked body longer than it: the chunks are the body, as HTTP says). A GET answers
`{"path": <the request target as received>}`, so a test can see the exact bytes of a query.
"""

from __future__ import annotations

import argparse
import json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

DEPTH = 100_000
NESTED = b'{"usage": ' + b"[" * DEPTH + b"]" * DEPTH + b"}"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self._answer(200, "application/json", json.dumps({"path": self.path}).encode())

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)) or b"{}")
        mode = body.get("hostile")
        if mode == "sse":
            events = b'data: {"choices": [{"delta": {"content": "hi"}}]}\n\ndata: ' + NESTED + b"\n\ndata: [DONE]\n\n"
            self._answer(200, "text/event-stream", events)
        elif mode == "short":
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(NESTED)))
            self.end_headers()
            self.wfile.write(NESTED[:1000])
            self.close_connection = True
        elif mode == "both":
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", "5")
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            self.wfile.write(b"b\r\nhello world\r\n0\r\n\r\n")
        else:
            self._answer(500 if mode == "error" else 200, "application/json", NESTED)

    def _answer(self, status: int, content_type: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    ThreadingHTTPServer(("127.0.0.1", parser.parse_args().port), Handler).serve_forever()


if __name__ == "__main__":
    main()
