"""The Host names the service answers to, and the refusal every other name gets.

A hostile web page can point a browser at 127.0.0.1 through DNS rebinding; its requests then carry the
attacker's host name, so refusing names the service was not reached by keeps such pages away from the
models and the admin. Listening on loopback, only the loopback names (or LLAMASWAP_ALLOWED_HOSTS) are
accepted. Listening beyond loopback, users reach the service by the machine's addresses and names, so
those are accepted as well. `/health` answers whatever the Host: probes use odd names and it reveals
nothing.
"""

from __future__ import annotations

import functools
import ipaddress
import socket
from pathlib import Path

from asgiref.sync import iscoroutinefunction
from django.conf import settings
from django.http.request import split_domain_port, validate_host
from django.utils.decorators import sync_and_async_middleware

ENV = "LLAMASWAP_ALLOWED_HOSTS"
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")
ANY_HOST = "*"
HEALTH_PATH = "/health"
# llama-swap's second liveness path, polled by wake-on-LAN proxies: the same answer.
HEALTH_PATHS = frozenset({HEALTH_PATH, "/wol-health"})


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def served_hosts(listen_host: str, configured: list[str]) -> list[str]:
    """The names accepted by a service listening on `listen_host`, given LLAMASWAP_ALLOWED_HOSTS."""
    if is_loopback(listen_host) or ANY_HOST in configured:
        return list(configured)
    return list(dict.fromkeys([*configured, *LOOPBACK_NAMES, *machine_names()]))


def machine_names() -> list[str]:
    """The host name, FQDN, mDNS name and every interface address of this machine, as a Host header has them."""
    hostname = socket.gethostname().lower()
    names = [hostname, socket.getfqdn().lower(), hostname.split(".")[0] + ".local"]
    addresses = sorted(_interface_addresses() | _resolved_addresses(hostname), key=lambda a: (a.version, a))
    return [*dict.fromkeys(names), *(f"[{a.compressed}]" if a.version == 6 else a.compressed for a in addresses)]


def _interface_addresses() -> set[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    """Linux lists every local address in /proc, secondary ones included; elsewhere this finds none."""
    found: set[ipaddress.IPv4Address | ipaddress.IPv6Address] = set()
    try:
        trie = Path("/proc/net/fib_trie").read_text().splitlines()
    except OSError:
        trie = []
    for previous, line in zip(trie, trie[1:]):
        if line.strip() == "/32 host LOCAL":
            found.add(ipaddress.IPv4Address(previous.split()[-1]))
    try:
        inet6 = Path("/proc/net/if_inet6").read_text().splitlines()
    except OSError:
        inet6 = []
    for line in inet6:
        found.add(ipaddress.IPv6Address(int(line.split()[0], 16)))
    return found


def _resolved_addresses(hostname: str) -> set[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    try:
        infos = socket.getaddrinfo(hostname, None)
    except OSError:
        return set()
    return {ipaddress.ip_address(info[4][0].split("%")[0]) for info in infos}


def host_refusal(host: str) -> str | None:
    """Why a request with this Host header is refused, or None when the name is served.

    The same test Django applies to ALLOWED_HOSTS, so its own check further on never disagrees.
    """
    return _host_refusal(host, tuple(settings.ALLOWED_HOSTS))


@functools.lru_cache(maxsize=256)
def _host_refusal(host: str, allowed: tuple[str, ...]) -> str | None:
    """`host_refusal` for these ALLOWED_HOSTS: a model request asks it every time, with one of a few names."""
    domain, _ = split_domain_port(host)
    if not domain:
        return f"Host {host!r} is not a valid host name, so it is none of the names this service answers to ({ENV})"
    if validate_host(domain, allowed):
        return None
    return (
        f"Host {host!r} is not a name this service answers to: add it to {ENV} "
        f"(comma-separated; {ANY_HOST} accepts any name)"
    )


@sync_and_async_middleware
def host_check_middleware(get_response):
    """Django's routes: `/health` for any Host, the JSON refusal for unknown names on every other route.

    Django's own refusal would name its ALLOWED_HOSTS setting, which users of llamaswap never set.
    """
    from proxy.api.responses import json_error
    from proxy.api.views import health

    def early_answer(request):
        if request.path in HEALTH_PATHS:
            return health(request)
        host = request.META.get("HTTP_HOST")
        refusal = host_refusal(host) if host is not None else None
        return json_error(400, refusal, "host_not_allowed") if refusal else None

    if iscoroutinefunction(get_response):
        async def middleware(request):
            answer = early_answer(request)
            return answer if answer is not None else await get_response(request)
    else:
        def middleware(request):
            answer = early_answer(request)
            return answer if answer is not None else get_response(request)
    return middleware
