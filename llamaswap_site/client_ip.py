"""The address a request came from, for the admin's login throttling (django-axes).

It is the TCP peer's address: a header a client sends could name anyone. Behind a reverse proxy every
request comes from the proxy, so `LLAMASWAP_TRUSTED_PROXIES` names the proxies' addresses; a request from
one of them is taken from the right-most `X-Forwarded-For` address that is not one of them (what the
nearest untrusted hop connected from; the addresses left of it are the client's to write).
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping


def trusted_proxies(text: str) -> frozenset[str]:
    return frozenset(address.strip() for address in text.split(",") if address.strip())


TRUSTED = trusted_proxies(os.environ.get("LLAMASWAP_TRUSTED_PROXIES", ""))


def client_address(meta: Mapping[str, str], trusted: Collection[str]) -> str:
    peer = meta.get("REMOTE_ADDR", "")
    if peer not in trusted:
        return peer
    hops = [hop.strip() for hop in meta.get("HTTP_X_FORWARDED_FOR", "").split(",") if hop.strip()]
    return next((hop for hop in reversed(hops) if hop not in trusted), peer)


def client_ip(request) -> str:
    """django-axes' AXES_CLIENT_IP_CALLABLE."""
    return client_address(request.META, TRUSTED)
