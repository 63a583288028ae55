"""Refusing the changes a page on another origin makes a browser send with the key it saved.

Every 401 asks for Basic credentials (`WWW-Authenticate: Basic`), so a browser given the key once
sends it again on its own with every request to this server, including those a page on another
origin makes: a form it submits, an <img> it loads. That page reads nothing back, but the request
still acts: it unloads a model, cancels a request, switches a profile, starts a model. So a request
that changes something and comes from another origin must present the key itself, as Bearer or
x-api-key (headers no form or image can set); with Basic alone it is refused with a 403.

"Another origin" is what the browser says. Sec-Fetch-Site `cross-site`, or `same-site` (another port
of this host is the same site but another origin, and may be another program); a browser that sends
no Sec-Fetch-Site is judged by its Origin, which must name this Host. Non-browser clients send
neither and are never refused here.
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import urlsplit

from proxy.serving.access import Caller

CROSS_SITE_CODE = "cross_site_request"
_OTHER_ORIGIN_SITES = frozenset({"cross-site", "same-site"})
_DEFAULT_PORTS = {"http": "80", "https": "443"}


def other_origin(headers: Mapping[str, str]) -> str | None:
    """The page's origin (or the browser's word for it) when the request comes from another origin, else None."""
    site = headers.get("sec-fetch-site", "").strip().lower()
    origin = headers.get("origin", "").strip()
    if site:
        return (origin or f"Sec-Fetch-Site: {site}") if site in _OTHER_ORIGIN_SITES else None
    if not origin:
        return None
    if origin == "null":  # a sandboxed frame, a file:// page, a redirect across origins
        return origin
    try:
        page = urlsplit(origin)
        page_host = (page.hostname or "", str(page.port or _DEFAULT_PORTS.get(page.scheme, "")))
        ours = urlsplit(f"{page.scheme}://{headers.get('host', '')}")
        our_host = (ours.hostname or "", str(ours.port or _DEFAULT_PORTS.get(page.scheme, "")))
    except ValueError:  # an Origin or Host that is no URL authority matches nothing
        return origin
    return None if page_host == our_host else origin


def cross_site_refusal(headers: Mapping[str, str], caller: Caller) -> str | None:
    """Why a state change from another origin that shows the key only as Basic credentials is refused
    (answered 403 `cross_site_request`), else None. Without keys there is no saved key to ride on."""
    if not (caller.keyed and caller.basic_only):
        return None
    origin = other_origin(headers)
    if origin is None:
        return None
    return (
        f"refused: a page on another origin ({origin}) sent this request with the browser's saved Basic "
        "credentials, and it would change something here; send the key as 'Authorization: Bearer <key>' or "
        "'x-api-key: <key>', or make the request from this server's own pages"
    )
