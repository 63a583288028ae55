"""The worker's metrics port: `llamaswap worker` has no Django server, so the scheduler's series get
an HTTP server of their own, behind the same API-key rule as a front end's /metrics."""

from __future__ import annotations

import socket
import threading
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

from proxy.api.metrics_view import refusal
from scheduling.metrics import WORKER


class _Quiet(WSGIRequestHandler):
    """Prometheus scrapes every few seconds: no log line for each."""

    def log_message(self, format, *args) -> None:
        pass


def serve(host: str, port: int) -> None:
    """Serve the worker's series from a thread of their own; raises OSError if it cannot listen."""
    export = make_wsgi_app(WORKER)

    def app(environ, start_response):
        headers = {name[5:].replace("_", "-").lower(): value for name, value in environ.items() if name.startswith("HTTP_")}
        refused = refusal(headers)
        if refused is None:
            return export(environ, start_response)
        start_response(
            "401 Unauthorized", [("Content-Type", "application/json"), ("WWW-Authenticate", 'Basic realm="llamaswap"')]
        )
        return [refused]

    class Server(ThreadingWSGIServer):
        address_family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]  # IPv6 too

    server = make_server(host, port, app, Server, handler_class=_Quiet)
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
