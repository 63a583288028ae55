"""Where a caller shows an API key: `Authorization: Bearer`, `x-api-key` or Basic (the password part), the
headers that carry one, and this server's own cookies, which no model server is sent. Which key it is, and what
it may do: `proxy.serving.access`."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable, Mapping

from django.conf import settings

# Headers that carry the proxy's own key: never forwarded upstream when keys guard the server, never stored.
CREDENTIAL_HEADERS = frozenset({"authorization", "x-api-key", "proxy-authorization"})
# Every header that may carry a caller's secret: its key for this server, a hosted API's key as the big
# gateways name it (Azure's `api-key` and `Ocp-Apim-Subscription-Key`, Google's `X-Goog-Api-Key`, OpenStack's
# and others' `X-Auth-Token`), cookies. A peer (another party) is sent none of them; captures store each as
# [REDACTED]. One set, so what a peer never sees and what a capture never keeps cannot drift apart.
SECRET_HEADERS = CREDENTIAL_HEADERS | {
    "api-key", "ocp-apim-subscription-key", "x-goog-api-key", "x-auth-token", "cookie", "set-cookie",
}


def without_own_cookies(headers: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """`headers` with this server's own cookies (the admin's session and CSRF token, by the names Django's
    settings give them) taken out of each `Cookie`, which is left out when nothing else is in it: what a model
    server or a peer is sent. Other cookies are the client's business with the model server."""
    own = {settings.SESSION_COOKIE_NAME, settings.CSRF_COOKIE_NAME}
    kept: list[tuple[str, str]] = []
    for name, value in headers:
        if name.lower() == "cookie":
            value = "; ".join(part.strip() for part in value.split(";")
                              if part.strip() and part.split("=", 1)[0].strip() not in own)
            if not value:
                continue
        kept.append((name, value))
    return kept


def presented_keys(headers: Mapping[str, str], *, basic: bool = True) -> list[str]:
    """Every key the client offered, from any of the three accepted places (Basic left out when
    `basic` is false: the browser may have sent it on its own)."""
    keys: list[str] = []
    api_key = headers.get("x-api-key")
    if api_key:
        keys.append(api_key.strip())
    auth = headers.get("authorization", "").strip()
    scheme, _, value = auth.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        keys.append(value.strip())
    elif scheme.lower() == "basic" and basic and value.strip():
        try:
            decoded = base64.b64decode(value.strip(), validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            decoded = ""
        _, sep, password = decoded.partition(":")
        if sep and password:
            keys.append(password)
    return keys
