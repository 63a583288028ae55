"""`peers:` — other servers (another llamaswap, llama-swap, or a hosted API) whose models are offered here.

A peer is not started, scheduled or swapped: its requests are relayed straight to its `proxy` URL.
Its models are asked for as `<peer>/<model>`, or by the bare name when exactly one peer lists it;
local model IDs and aliases always win.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from .errors import ProblemLog, kind_of
from .fields import MISSING, Section
from .filters import ModelFilters
from .model import UpstreamTimeouts, http_url_problem, read_strip_and_set_params, read_upstream_timeouts
from .secrets import shown_url

# A peer is another machine or a hosted API: wait at most this long for its response headers.
DEFAULT_PEER_RESPONSE_HEADER_TIMEOUT = 60.0


@dataclass(frozen=True)
class PeerConfig:
    id: str
    proxy: str  # base URL; the request path is appended
    models: tuple[str, ...]  # the names the peer itself knows them by
    api_key: str = ""  # sent as `Authorization: Bearer` and `x-api-key` when set
    filters: ModelFilters = field(default_factory=ModelFilters)
    timeouts: UpstreamTimeouts = field(
        default_factory=lambda: UpstreamTimeouts(response_header=DEFAULT_PEER_RESPONSE_HEADER_TIMEOUT)
    )

    def qualified(self, model: str) -> str:
        """The name that always reaches `model` on this peer."""
        return f"{self.id}/{model}"


def read_peers(top: Section) -> dict[str, PeerConfig]:
    """Every entry under `peers:`, by ID (problems go to the section's log)."""
    peers_section = top.section("peers")
    if peers_section is None:
        return {}
    peers: dict[str, PeerConfig] = {}
    for raw_id in list(peers_section.data):
        peer_id = str(raw_id)
        key = peers_section.path(peer_id)
        problem = _peer_id_problem(raw_id)
        if problem:
            top.log.error(key, problem)
            peers_section.raw(raw_id)
            continue
        entry = peers_section.section(raw_id)
        if entry is None:
            if peers_section.raw(raw_id) is None:
                top.log.error(key, "empty — give the peer `proxy:` and `models:`")
            continue
        peer = _read_peer(raw_id, entry)
        if peer is not None:
            peers[raw_id] = peer
    _check_qualified_names_differ(peers, top.log)
    return peers


def _peer_id_problem(raw_id: object) -> str:
    """Why `raw_id` cannot name a peer ("" when it can): its models are asked for as `<ID>/<model>`."""
    if raw_id is None or raw_id == "":
        return "a peer ID cannot be empty — name the peer, e.g. box: {proxy: ..., models: [...]}"
    if not isinstance(raw_id, str):
        return f'a peer ID must be text, got {kind_of(raw_id)} — quote it: "{raw_id}":'
    if raw_id != raw_id.strip():
        return (
            "the peer ID starts or ends with whitespace, and requested model names are stripped, so "
            f'"{raw_id}/<model>" could never be asked for — remove the spaces: "{raw_id.strip()}":'
        )
    return ""


def _check_qualified_names_differ(peers: Mapping[str, PeerConfig], log: ProblemLog) -> None:
    """`we` listing `ird/x` and `we/ird` listing `x` both make `we/ird/x`, which could reach only one of them."""
    first: dict[str, tuple[str, int]] = {}
    for peer in peers.values():
        for position, model in enumerate(peer.models):
            qualified = peer.qualified(model)
            if qualified not in first:
                first[qualified] = (peer.id, position)
                continue
            other_id, other_position = first[qualified]
            log.error(
                f"peers.{peer.id}.models[{position}]",
                f'"{qualified}" is also the name of peers.{other_id}.models[{other_position}] '
                f'("{peers[other_id].models[other_position]}" on peer {other_id}), so one of them could never be '
                "reached — rename one of the two peers (a peer ID without '/' cannot collide)",
            )


def _read_peer(peer_id: str, entry: Section) -> PeerConfig | None:
    proxy = _read_proxy(entry)
    models = _read_models(entry)
    api_key = entry.text("apiKey").strip()
    if any(char.isspace() for char in api_key):
        entry.error("apiKey", "contains whitespace — it is sent in one header token; remove the spaces")
    peer = PeerConfig(
        id=peer_id,
        proxy=proxy,
        models=models,
        api_key=api_key,
        filters=_read_filters(entry),
        timeouts=_read_timeouts(entry),
    )
    entry.warn_unread()
    return peer if proxy and models else None


def _read_proxy(entry: Section) -> str:
    if not entry.has("proxy"):
        entry.raw("proxy")
        entry.error("proxy", "missing — set the peer's base URL, e.g. proxy: http://192.168.1.23:8080")
        return ""
    proxy = entry.text("proxy").strip()
    problem = http_url_problem(proxy)
    if problem:
        if not entry.log.is_unknown(entry.path("proxy")):
            entry.error("proxy", f'"{shown_url(proxy)}" {problem} — e.g. proxy: https://openrouter.ai/api')
        return ""
    parts = urlsplit(proxy)
    if "?" in proxy or "#" in proxy:
        entry.error(
            "proxy",
            f'"{shown_url(f"{parts.scheme}://{parts.netloc}{parts.path}")}?…" has a query or fragment (not shown: it '
            'may hold a key), but the request path (with its own query) is appended '
            f'to the proxy URL — give the base URL alone, e.g. proxy: {shown_url(f"{parts.scheme}://{parts.netloc}{parts.path}")}',
        )
        return ""
    return proxy.rstrip("/")


def _read_models(entry: Section) -> tuple[str, ...]:
    raw = entry.raw("models")
    if raw is MISSING or raw is None or raw == []:
        state = "is empty" if raw == [] else "missing"
        entry.error("models", f"{state} — list the model names the peer serves, e.g. models: [llama-3.1-8b]")
        return ()
    models: list[str] = []
    for position, name in enumerate(entry.text_list("models", example="llama-3.1-8b")):
        name = name.strip()
        key = f"{entry.path('models')}[{position}]"
        if not name:
            entry.log.error(key, "empty model name — remove the entry")
        elif name in models:
            entry.log.error(key, f'"{name}" is listed twice — remove one')
        else:
            models.append(name)
    return tuple(models)


def _read_filters(entry: Section) -> ModelFilters:
    """`stripParams` and `setParams`, as for a model; `model` stays protected (it names the peer's model)."""
    filters = entry.section("filters")
    if filters is None:
        return ModelFilters()
    strip, set_params = read_strip_and_set_params(filters, "list the peer's own model names under models")
    filters.warn_unread()
    return ModelFilters(strip_params=strip, set_params=set_params)


def _read_timeouts(entry: Section) -> UpstreamTimeouts:
    return read_upstream_timeouts(
        entry.section("timeouts"), UpstreamTimeouts(response_header=DEFAULT_PEER_RESPONSE_HEADER_TIMEOUT)
    )


class PeerModels:
    """Which peer serves a name that is not a local model: `<peer>/<model>`, or a bare name one peer lists."""

    def __init__(self, peers: Mapping[str, PeerConfig]):
        self._qualified: dict[str, tuple[PeerConfig, str]] = {}
        self._bare: dict[str, list[PeerConfig]] = {}
        for peer in peers.values():
            for model in peer.models:
                self._qualified[peer.qualified(model)] = (peer, model)
                self._bare.setdefault(model, []).append(peer)

    def find(self, name: str) -> tuple[PeerConfig, str] | None:
        found = self._qualified.get(name)
        if found is not None:
            return found
        offering = self._bare.get(name, ())
        return (offering[0], name) if len(offering) == 1 else None

    def offering(self, name: str) -> tuple[str, ...]:
        """The qualified names of every peer model called `name` (several: the bare name is ambiguous)."""
        return tuple(peer.qualified(name) for peer in self._bare.get(name, ()))


def warn_shadowed(peers: Mapping[str, PeerConfig], is_local: Callable[[str], bool], log: ProblemLog) -> None:
    """A `<peer>/<model>` that is also a local ID or alias can only reach the local model: say so."""
    for peer in peers.values():
        for position, model in enumerate(peer.models):
            if is_local(peer.qualified(model)):
                log.warn(
                    f"peers.{peer.id}.models[{position}]",
                    f'"{peer.qualified(model)}" is also a local model ID or alias, which wins — rename one of them',
                )
