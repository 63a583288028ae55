"""API keys: `Authorization: Bearer`, `x-api-key` or Basic (the password part), compared in constant time."""

from __future__ import annotations

import base64
import binascii
import hmac
from collections.abc import Iterable, Mapping

# Headers that carry the proxy's own key: never forwarded upstream, never stored.
CREDENTIAL_HEADERS = frozenset({"authorization", "x-api-key", "proxy-authorization"})


def presented_keys(headers: Mapping[str, str]) -> list[str]:
    """Every key the client offered, from any of the three accepted places."""
    keys: list[str] = []
    api_key = headers.get("x-api-key")
    if api_key:
        keys.append(api_key.strip())
    auth = headers.get("authorization", "").strip()
    scheme, _, value = auth.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        keys.append(value.strip())
    elif scheme.lower() == "basic" and value.strip():
        try:
            decoded = base64.b64decode(value.strip(), validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            decoded = ""
        _, sep, password = decoded.partition(":")
        if sep and password:
            keys.append(password)
    return keys


def is_authorized(headers: Mapping[str, str], api_keys: Iterable[str]) -> bool:
    """True when no keys are configured, or when any presented key matches any configured key."""
    configured = [k.encode() for k in api_keys]
    if not configured:
        return True
    ok = False
    for presented in presented_keys(headers):
        candidate = presented.encode("utf-8", "surrogateescape")
        for key in configured:
            # Check every pair so timing does not reveal which key (or how much of it) matched.
            ok |= hmac.compare_digest(candidate, key)
    return ok
