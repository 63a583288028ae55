"""One entry under `models:` — how to start, reach, check and stop one upstream server."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from scheduling.core.placement import MemoryNeed

from .capabilities import ModelCapabilities, read_capabilities
from .command import split_command, strip_comment_lines
from .compat import concurrency_floor, read_ignore_websockets
from .errors import ProblemLog, kind_of
from .fields import MISSING, Section
from .filters import ModelFilters, parse_strip_params
from .frozen import FrozenDict, freeze
from .hardware import HardwareSection, read_model_memory
from .macros import MacroCycle, MacroScope
from .secrets import shown_url

DEFAULT_CHECK_ENDPOINT = "/health"
DEFAULT_CONCURRENCY_LIMIT = 10
PORT_REF = "${PORT}"
PID_REF = "${PID}"
GPUS_REF = "${GPUS}"  # the ids of the GPUs a model starts on, filled in at each start (hardware only)
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

DEFAULT_CONNECT_TIMEOUT = 30.0
DEFAULT_KEEPALIVE_INTERVAL = 30.0
DEFAULT_TLS_HANDSHAKE_TIMEOUT = 10.0
# llama-swap keeps an idle pooled connection 90 s. llama-server (cpp-httplib) closes one after 5 s,
# and a request written to a connection the server is closing fails, so llamaswap's default is 5 s.
DEFAULT_IDLE_CONN_TIMEOUT = 5.0
# Linux refuses a TCP keepalive idle time or interval above 32767 s (TCP_KEEPIDLE, TCP_KEEPINTVL),
# so a larger `keepalive` would fail every connection to the model at setsockopt.
MAX_KEEPALIVE_S = 32767
MODEL_KEY_NOTES = {
    "healthCheckTimeout": "cannot be set per model, ignored — set the top-level healthCheckTimeout",
}
# Names other tools give to a model's setting (by the name in lower case), and what it is called here.
_START_TIMEOUT = "a start is bounded by the top-level healthCheckTimeout (llama-swap has no per-model one)"
_ADDRESS = "the model's address is its proxy (e.g. proxy: http://127.0.0.1:${PORT}, with --port ${PORT} in cmd)"
MODEL_KEYS_MEANT = {
    **dict.fromkeys(("readytimeout", "starttimeout", "startuptimeout", "loadtimeout", "healthtimeout"), _START_TIMEOUT),
    **dict.fromkeys(("host", "port"), _ADDRESS),
    **dict.fromkeys(("url", "baseurl", "base_url", "api_base", "endpoint", "address"),
                    "did you mean proxy? (the URL of the model's server)"),
    **dict.fromkeys(("stoptimeout", "shutdowntimeout", "killtimeout"), "did you mean unloadTimeout?"),
    **dict.fromkeys(("healthcheck", "health", "healthendpoint"), "did you mean checkEndpoint?"),
    "command": "did you mean cmd?",
    "idletimeout": "did you mean ttl? (the seconds a model stays loaded unused)",
}


@dataclass(frozen=True)
class UpstreamTimeouts:
    """llama-swap's `timeouts` (seconds; None: 0 in the file, no limit). `response_header` also
    bounds each gap between response chunks, since httpcore has one read timeout for both.
    `expectContinue` has no field: llamaswap never sends `Expect: 100-continue`, so there is no
    wait for it to bound."""

    connect: float | None = DEFAULT_CONNECT_TIMEOUT
    response_header: float | None = None
    keepalive: float | None = DEFAULT_KEEPALIVE_INTERVAL  # TCP keepalive probes: idle time and interval
    tls_handshake: float | None = DEFAULT_TLS_HANDSHAKE_TIMEOUT  # https upstreams only
    idle_conn: float | None = DEFAULT_IDLE_CONN_TIMEOUT  # how long an unused pooled connection is kept


@dataclass(frozen=True)
class ModelConfig:
    id: str
    cmd: tuple[str, ...]
    cmd_stop: tuple[str, ...]
    proxy: str
    check_endpoint: str | None
    ttl: float
    unload_timeout: float
    aliases: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    unlisted: bool
    use_model_name: str
    name: str
    description: str
    concurrency_limit: int
    filters: ModelFilters
    metadata: Mapping[str, Any]
    port: int | None
    timeouts: UpstreamTimeouts = field(default_factory=UpstreamTimeouts)
    # Stream the wait (place in the queue, predicted wait, loading) to a streaming chat client.
    send_loading_state: bool = False
    # compat.ignoreWebsockets: upgrades bypass the scheduler, never load the model, are not counted.
    ignore_websockets: bool = False
    capabilities: ModelCapabilities = ModelCapabilities()
    # Where each alias was named (aliases[i] or a setParamsByID key), for messages about a clash.
    alias_keys: tuple[str, ...] = ()
    # `memory` and `gpus`: what it takes on each GPU it uses (None when the config has no `hardware:`).
    memory: MemoryNeed | None = None
    # Never stopped to make room for another model (only an operator's unload stops it).
    pinned: bool = False
    # minResidency: seconds after its start during which it is not stopped to make room for another.
    min_residency: float = 0.0


@dataclass(frozen=True)
class ModelDefaults:
    """Top-level values a model falls back to."""

    global_ttl: float
    unload_timeout: float
    send_loading_state: bool = False
    hardware: HardwareSection = HardwareSection()


def read_model(
    model_id: str,
    entry: Any,
    global_scope: MacroScope,
    defaults: ModelDefaults,
    allocate_port: Callable[[], int],
    log: ProblemLog,
) -> ModelConfig | None:
    """Check one model entry; `allocate_port` is called only when cmd uses ${PORT}."""
    key = f"models.{model_id}"
    if not isinstance(entry, dict):
        log.error(key, f"expected a mapping with at least `cmd:`, got {kind_of(entry)}")
        return None
    entry = dict(entry)
    for name in ("cmd", "cmdStop"):  # comment lines go before macro expansion
        if isinstance(entry.get(name), str):
            entry[name] = strip_comment_lines(entry[name])

    section = Section(entry, key, log, model_id=model_id)
    scope = MacroScope.declare(
        section.raw("macros", None), f"{key}.macros", log, parent=global_scope.with_value("MODEL_ID", model_id)
    )
    port = None
    if _cmd_uses_port(entry.get("cmd"), scope):
        port = allocate_port()
        scope = scope.with_value("PORT", port)
    section.scope = scope

    gpus_ref = (GPUS_REF,) if defaults.hardware.given else ()
    cmd = _read_cmd(section, gpus_ref)
    filters = _read_filters(section)
    aliases, alias_keys = _read_aliases(section, filters)
    cmd_stop = _read_argv(section, "cmdStop", allow_refs=(PID_REF, *gpus_ref))
    env = _read_env(section)
    if defaults.hardware.given and any(name == "CUDA_VISIBLE_DEVICES" for name, _ in env):
        log.warn(
            section.path("env"),
            "CUDA_VISIBLE_DEVICES is set at each start to the GPUs placement gives the model (hardware:), "
            "so this value is replaced — remove it",
        )
    model = ModelConfig(
        id=model_id,
        cmd=cmd,
        cmd_stop=cmd_stop,
        proxy=_read_proxy(section, port),
        check_endpoint=_read_check_endpoint(section),
        ttl=_read_ttl(section, defaults.global_ttl),
        unload_timeout=section.number("unloadTimeout", 0, minimum=0, example="10") or defaults.unload_timeout,
        aliases=aliases,
        env=env,
        unlisted=section.boolean("unlisted", False),
        use_model_name=section.text("useModelName"),
        name=section.text("name"),
        description=section.text("description"),
        concurrency_limit=concurrency_floor(
            model_id, section.integer("concurrencyLimit", 0, minimum=0, example="4") or DEFAULT_CONCURRENCY_LIMIT
        ),
        filters=filters,
        metadata=_read_metadata(section),
        port=port,
        timeouts=_read_timeouts(section),
        send_loading_state=section.boolean("sendLoadingState", defaults.send_loading_state),
        ignore_websockets=read_ignore_websockets(section, model_id),
        capabilities=read_capabilities(section),
        alias_keys=alias_keys,
        memory=read_model_memory(section, defaults.hardware),
        pinned=section.boolean("pinned", False),
        min_residency=section.number("minResidency", 0.0, minimum=0, example="300"),
    )
    if not defaults.hardware.given:
        for key in ("pinned", "minResidency"):
            if section.has(key):
                section.log.warn(section.path(key), "takes effect with a top-level hardware: section (placement by memory); "
                                  "without one the groups or matrix decide alone and this is ignored")
    section.warn_unread(MODEL_KEY_NOTES, MODEL_KEYS_MEANT)
    return model


def _cmd_uses_port(cmd: Any, scope: MacroScope) -> bool:
    if not isinstance(cmd, str):
        return False
    try:
        return PORT_REF in scope.expand(cmd, typed=False)
    except MacroCycle:
        return False  # reported when cmd is read


def _read_cmd(section: Section, allow_refs: tuple[str, ...]) -> tuple[str, ...]:
    """The command that starts the model's server. Without one, an entry that has a `proxy` is loaded as llama-swap
    loads it, and each request for it fails at its start (`ModelProcess`); without either, nothing says where the
    server is."""
    problems_before = len(section.log.problems)
    argv = _read_argv(section, "cmd", allow_refs=allow_refs)
    if not argv and len(section.log.problems) == problems_before:
        state = "is empty" if section.has("cmd") else "missing"
        if section.has("proxy"):
            section.log.warn(
                section.path("cmd"),
                f"{state}: llama-swap loads a model with a proxy and no cmd, and fails each request for it, since it "
                "starts every model it serves; so does llamaswap (the model is listed; a request for it gets 503). "
                "A server that runs on its own is a peer: peers: {<name>: {proxy: <its URL>, models: "
                f"[{section.model_id}]}}}}",
            )
        else:
            section.error(
                "cmd",
                f"{state} — every model needs the command that starts its server, "
                "e.g. cmd: llama-server --port ${PORT} -m /models/model.gguf",
            )
    return argv


def _read_argv(section: Section, name: str, *, allow_refs: tuple[str, ...] = ()) -> tuple[str, ...]:
    text = section.text(name, allow_refs=allow_refs)
    if not text.strip():
        return ()
    try:
        return split_command(text)
    except ValueError as exc:
        section.error(name, str(exc))
        return ()


def _read_proxy(section: Section, port: int | None) -> str:
    if not section.has("proxy"):
        section.raw("proxy")
        if port is not None:
            return f"http://127.0.0.1:{port}"
        if section.log.is_unknown(section.path("cmd")):
            return ""  # whether cmd uses ${PORT} depends on a variable that is not set
        section.error(
            "proxy",
            "not set, and cmd does not use ${PORT}, so llamaswap cannot tell where the server listens — "
            "set proxy: http://127.0.0.1:<port>, or add `--port ${PORT}` to cmd",
        )
        return ""
    proxy = section.text("proxy")
    if not proxy:
        return ""
    problem = http_url_problem(proxy)
    if problem:
        section.error("proxy", f'"{shown_url(proxy)}" {problem} — e.g. proxy: http://127.0.0.1:8080')
        return ""
    return proxy.rstrip("/")


def http_url_problem(url: str) -> str:
    """Why `url` cannot be an upstream's base URL ("" when it can): an http(s) scheme, a host, a port that
    is a number in range, and no whitespace (it goes into the request line)."""
    if any(char.isspace() for char in url):
        return "has whitespace in it"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:  # a bracketed host that is no IPv6 address, a port out of range or not a number
        return f"is not a valid URL ({exc})"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "is not an http(s) URL"
    if port == 0:
        return "has port 0"
    return ""


def _read_check_endpoint(section: Section) -> str | None:
    endpoint = section.text("checkEndpoint", DEFAULT_CHECK_ENDPOINT).strip()
    if endpoint == "none":
        return None
    return "/" + endpoint.lstrip("/")


def _read_ttl(section: Section, global_ttl: float) -> float:
    ttl = section.number("ttl", -1, example="300")
    if ttl == -1:
        return global_ttl
    if ttl < 0:
        section.error(
            "ttl",
            f"{ttl:g} is negative — use a number of idle seconds, 0 to never unload, or -1 for globalTTL",
        )
        return global_ttl
    return ttl


def _read_env(section: Section) -> tuple[tuple[str, str], ...]:
    pairs = []
    for index, item in enumerate(section.text_list("env", example='"CUDA_VISIBLE_DEVICES=0"')):
        name, equals, value = item.partition("=")
        if not equals or not ENV_NAME.fullmatch(name):
            # The value may be a token (HF_TOKEN=…): the problem quotes the name alone, never the entry.
            written = f'"{name}=…" is not NAME=value' if equals else "has no '=' (NAME=value)"
            section.log.error(
                f"{section.path('env')}[{index}]",
                f'{written} — write it like "CUDA_VISIBLE_DEVICES=0" '
                "(names use letters, digits and '_', and do not start with a digit)",
            )
            continue
        pairs.append((name, value))
    return tuple(pairs)


def _read_aliases(section: Section, filters: ModelFilters) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """`aliases`, then each setParamsByID key that is not the model's ID or already an alias: the names
    a client can ask for the model by, and where each was written."""
    aliases, keys = [], []
    for index, alias in enumerate(section.text_list("aliases", example='"gpt-4o-mini"')):
        key = f"{section.path('aliases')}[{index}]"
        problem = _request_name_problem(alias, '"gpt-4o-mini"')
        if problem:
            section.log.error(key, problem)
            continue
        aliases.append(alias)
        keys.append(key)
    for name in filters.set_params_by_id:
        if name != section.model_id and name not in aliases:
            aliases.append(name)
            keys.append(f"{section.path('filters.setParamsByID')}.{name}")
    return tuple(aliases), tuple(keys)


def _request_name_problem(name: str, example: str) -> str | None:
    """Why a name clients would ask for cannot be one: requests strip the model name they give,
    so an empty name, or one with spaces around it, could never be reached."""
    if not name.strip():
        return f"the name is empty — write a name clients can ask for, e.g. {example}"
    if name != name.strip():
        return f'"{name}" has spaces around it, and requests strip them — write "{name.strip()}"'
    return None


def _read_timeouts(section: Section) -> UpstreamTimeouts:
    return read_upstream_timeouts(section.section("timeouts"), UpstreamTimeouts())


def read_upstream_timeouts(timeouts: Section | None, defaults: UpstreamTimeouts) -> UpstreamTimeouts:
    """A model's or a peer's `timeouts:` block, over `defaults`; 0 turns a limit off."""
    if timeouts is None:
        return defaults

    def seconds(name: str, default: float | None, example: str, maximum: float | None = None) -> float | None:
        return timeouts.number(name, default or 0, minimum=0, maximum=maximum, example=example) or None

    read = UpstreamTimeouts(
        connect=seconds("connect", defaults.connect, "30"),
        response_header=seconds("responseHeader", defaults.response_header, "120"),
        keepalive=seconds("keepalive", defaults.keepalive, "30", MAX_KEEPALIVE_S),
        tls_handshake=seconds("tlsHandshake", defaults.tls_handshake, "10"),
        idle_conn=seconds("idleConn", defaults.idle_conn, "90"),
    )
    timeouts.number("expectContinue", 1, minimum=0, example="1")  # checked; nothing waits for a 100 Continue
    timeouts.warn_unread()
    return read


def _read_filters(section: Section) -> ModelFilters:
    filters = section.section("filters")
    if filters is None:
        return ModelFilters()
    strip, set_params = read_strip_and_set_params(filters, "use useModelName to rename the model upstream")
    set_params_by_id = _read_set_params_by_id(filters)
    filters.warn_unread()
    return ModelFilters(strip_params=strip, set_params=set_params, set_params_by_id=freeze(set_params_by_id))


def read_strip_and_set_params(filters: Section, rename_hint: str) -> tuple[tuple[str, ...], FrozenDict]:
    """`stripParams` (or its old spelling `strip_params`) and `setParams`, as models and peers share them:
    `model` is protected in both, and `rename_hint` says how to rename the model instead."""
    strip_text = filters.text("stripParams")
    legacy = filters.text("strip_params")
    if legacy and strip_text:
        filters.log.warn(filters.path("strip_params"), "old spelling of stripParams, ignored because stripParams is set — remove it")
    strip, protected = parse_strip_params(strip_text or legacy)
    for name in protected:
        filters.log.warn(filters.path("stripParams"), f"{name} is protected and never stripped — remove it from the list")

    set_params = filters.expanded("setParams")
    if set_params is MISSING or set_params is None:
        set_params = {}
    elif not isinstance(set_params, dict):
        filters.error("setParams", f"expected a mapping of param: value, got {kind_of(set_params)} — e.g. setParams: {{temperature: 0.7}}")
        set_params = {}
    if "model" in set_params:
        filters.log.warn(filters.path("setParams.model"), f"model is protected and never overridden, ignored — {rename_hint}")
    return tuple(strip), freeze({str(k): v for k, v in set_params.items() if k != "model"})


def _read_set_params_by_id(filters: Section) -> dict[str, dict]:
    """`{requested name: params}`; the names are macro-expanded, the params are checked like setParams."""
    table = filters.raw("setParamsByID")
    if table is MISSING or table is None:
        return {}
    if not isinstance(table, dict):
        filters.error(
            "setParamsByID",
            f"expected a mapping of model name: params, got {kind_of(table)} — "
            'e.g. setParamsByID: {"${MODEL_ID}:high": {reasoning_effort: high}}',
        )
        return {}
    by_id: dict[str, dict] = {}
    written: dict[str, str] = {}
    entries = Section(table, filters.path("setParamsByID"), filters.log, filters.scope, model_id=filters.model_id)
    for raw_name in table:
        name = filters.expanded_key("setParamsByID", raw_name)
        params = entries.expanded(raw_name)
        key = entries.path(str(raw_name))
        if name is None or params is MISSING:
            continue
        problem = _request_name_problem(name, '"${MODEL_ID}:high"')
        if problem:
            filters.log.error(key, problem)
            continue
        if name in written:
            filters.log.error(key, f'names "{name}", as "{written[name]}" does — keep one entry')
            continue
        written[name] = str(raw_name)
        if params is None:
            params = {}
        if not isinstance(params, dict):
            filters.log.error(key, f"expected a mapping of param: value, got {kind_of(params)} — e.g. {{temperature: 0.7}}")
            continue
        if "model" in params:
            filters.log.warn(f"{key}.model", "model is protected and never overridden, ignored — use useModelName to rename the model upstream")
            params = {k: v for k, v in params.items() if k != "model"}
        by_id[name] = {str(k): v for k, v in params.items()}
    return by_id


def _read_metadata(section: Section) -> Mapping[str, Any]:
    metadata = section.expanded("metadata")
    if metadata is MISSING or metadata is None:
        return FrozenDict()
    if not isinstance(metadata, dict):
        section.error("metadata", f"expected a mapping, got {kind_of(metadata)} — e.g. metadata: {{family: llama}}")
        return FrozenDict()
    return freeze(metadata)
