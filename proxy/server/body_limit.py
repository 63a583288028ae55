"""How large a request body may be, checked by the HTTP server as the body arrives: from its Content-Length at
the head, or as a chunked body passes the limit. Twisted writes a body to a temporary file before the application
sees any of it, so a limit the application checks afterwards would let one request fill the disk first."""

from __future__ import annotations

from dataclasses import dataclass

from proxy.serving.errors import ProxyError


@dataclass(frozen=True)
class BodyLimit:
    """The most bytes a route's body may have; `setting` names what sets it in the 413, `code` is the 413's code.
    `needs_length`: the route refuses a chunked body (411) from its head."""

    max_bytes: int
    setting: str
    code: str
    needs_length: bool = False

    def over(self, length: int | None) -> ProxyError:
        """The 413 for a body of `length` bytes (None: a chunked body that passed the limit)."""
        size = "the request body is over" if length is None else f"the request body is {length} bytes, over"
        return ProxyError(413, f"{size} the {self.max_bytes} byte limit ({self.setting})", self.code)

    @staticmethod
    def length_required() -> ProxyError:
        return ProxyError(411, "send the upload with a Content-Length (as the openai SDK and curl -F do), not chunked",
                          "length_required")


def request_body_limit(config) -> BodyLimit:
    """Every route's limit but an upload's: maxRequestBodyBytes, as the model routes check it."""
    return BodyLimit(config.max_request_body_bytes, "maxRequestBodyBytes", "request_too_large")
