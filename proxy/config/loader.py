"""Loading llama-swap's `config.yaml`: the `Config` every other part of llamaswap reads."""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property, partial
from types import MappingProxyType

from scheduling.core.matrix import MatrixPolicy
from scheduling.core.placement import Hardware, MemoryNeed
from scheduling.core.swap import SwapGroup

from .errors import ConfigError, Problem, ProblemLog, kind_of
from .fields import MISSING, Section
from .hardware import read_hardware, warn_unfitting_pins
from .log_output import LogOutput, read_log_output
from .macros import MacroScope
from .model import ModelConfig, ModelDefaults, read_model
from .model_index import ModelIndex
from .peers import PeerConfig, PeerModels, read_peers, warn_shadowed
from .profiles import ProfileConfig, read_profiles
from .selectors import SelectorConfig, coexistence_check, read_selectors
from .performance import PerformanceConfig, read_performance
from .routing import SchedulerConfig, read_router, read_scheduler
from .secrets import shown_argv, shown_url
from .upstream_paths import DEFAULT_IGNORE_PATHS, read_ignore_paths
from .yaml_document import read_yaml_document

DEFAULT_HEALTH_CHECK_TIMEOUT = 120.0
MIN_HEALTH_CHECK_TIMEOUT = 15.0
SHORT_HEALTH_TIMEOUT_ENV = "LLAMASWAP_ALLOW_SHORT_HEALTH_TIMEOUT"
DEFAULT_START_PORT = 5800
DEFAULT_UNLOAD_TIMEOUT = 10.0
DEFAULT_MAX_REQUEST_BODY_BYTES = 32 * 1024 * 1024
DEFAULT_MAX_BATCH_FILE_BYTES = 200 * 1024 * 1024  # OpenAI's own limit for a batch input file
LOG_LEVELS = ("debug", "info", "warn", "error")

# llama-swap keys whose job llamaswap does another way: each is ignored, with the reason.
TOP_KEY_NOTES = {
    "logRequests": "deprecated in llama-swap and ignored — remove it",
    "store": "ignored: llamaswap always keeps every request in its database (the data dir's SQLite file, or "
    "PostgreSQL with DATABASE_URL) — remove it",
    "metricsMaxInMemory": "ignored: llamaswap's activity lives in its database, not in a capped in-memory store — "
    "remove it",
    "ui": "ignored: llamaswap has no llama-swap web UI to configure (its admin is at /admin/) — remove it",
}
# Names other tools give to a top-level setting (by the name in lower case), and what it is called here.
_START_TIMEOUT = "did you mean healthCheckTimeout? (the seconds a starting model has to answer its health check)"
_LISTEN = "the address llamaswap listens on is no config key: `llamaswap serve --listen HOST:PORT`, as llama-swap's --listen"
TOP_KEYS_MEANT = {
    **dict.fromkeys(("readytimeout", "starttimeout", "startuptimeout", "loadtimeout", "healthtimeout"), _START_TIMEOUT),
    **dict.fromkeys(("host", "port", "listen", "address", "bind"), _LISTEN),
    "ttl": "did you mean globalTTL? (a model's own is models.<id>.ttl)",
}


@dataclass(frozen=True)
class Config:
    path: str
    models: Mapping[str, ModelConfig]
    groups: tuple[SwapGroup, ...]
    health_check_timeout: float
    start_port: int
    global_ttl: float
    unload_timeout: float
    api_keys: tuple[str, ...]
    log_level: str
    preload: tuple[str, ...]
    scheduler: SchedulerConfig
    max_request_body_bytes: int
    metrics_require_api_key: bool
    warnings: tuple[str, ...]
    aliases: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))  # alias -> model ID
    matrix: MatrixPolicy | None = None  # set when routing.router.use is matrix; groups are then empty
    include_aliases_in_list: bool = False  # /v1/models also lists each alias as a model of its own
    ignore_paths: tuple[re.Pattern, ...] = DEFAULT_IGNORE_PATHS  # /upstream paths that never load a model
    log_output: LogOutput = LogOutput()
    peers: Mapping[str, PeerConfig] = field(default_factory=lambda: MappingProxyType({}))  # peer ID -> peer
    performance: PerformanceConfig = PerformanceConfig()
    selectors: Mapping[str, SelectorConfig] = field(default_factory=lambda: MappingProxyType({}))  # selector ID -> selector
    profiles: Mapping[str, ProfileConfig] = field(default_factory=lambda: MappingProxyType({}))  # name -> profile
    capture_buffer_mb: float = 0.0  # captureBuffer: MB of request/response captures kept in memory; 0 is off
    max_batch_file_bytes: int = DEFAULT_MAX_BATCH_FILE_BYTES  # maxBatchFileBytes: the largest /v1/files upload
    max_batch_storage_bytes: int = 0  # maxBatchStorageBytes: the most bytes of files one key keeps; 0: no limit
    max_batch_file_lines: int = 50_000  # maxBatchFileLines: the most lines a batch input file holds (OpenAI's)
    startup_profile: str = ""  # hooks.on_startup.profile: active at start and after a reload ("" for none)
    remember_profile: bool = False  # profileStateFile is set: a start keeps the profile last selected
    # `hardware:`; when set, every model has its `memory` (see docs/configuration.md, Hardware and memory placement).
    hardware: Hardware | None = None

    def resolve(self, name: str) -> ModelConfig | None:
        """The model a request names, by ID or alias."""
        model = self.models.get(name)
        if model is None and name in self.aliases:
            model = self.models[self.aliases[name]]
        return model

    def peer_model(self, name: str) -> tuple[PeerConfig, str] | None:
        """The peer serving `name` and the peer's own name for it, when `name` is not a local ID or alias:
        `<peer>/<model>`, or a bare model name that exactly one peer lists (see `peers_offering`)."""
        if self.resolve(name) is not None:
            return None
        return self._peer_models.find(name)

    def peers_offering(self, name: str) -> tuple[str, ...]:
        """The `<peer>/<model>` names of every peer listing the bare `name` (two or more: it is ambiguous)."""
        return self._peer_models.offering(name)

    @cached_property
    def _peer_models(self) -> PeerModels:
        return PeerModels(self.peers)

    def describe(self) -> str:
        """Human summary printed at start, so operators see what was understood."""
        scheduler = self.scheduler
        if scheduler.use == "serial":
            how = f"agingDivisor {scheduler.serial.aging_divisor:g}, swapAffinityBonus {scheduler.serial.swap_affinity_bonus}"
            slots = ", ".join(f"{model}: {count}" for model, count in scheduler.serial.slots.items())
            how += f", slots {slots}" if slots else ", 1 slot per model"
            how += ", API keys take turns (fairness: keys)" if scheduler.serial.fairness == "keys" else ""
        else:
            how = ", ".join(f"{model}={value}" for model, value in scheduler.fifo_priority.items())
            how = f"priority {how}" if how else "no per-model priority"
        lines = [
            f"config {self.path}",
            f"scheduler: {scheduler.use} ({how})",
            "healthCheckTimeout {}s, globalTTL {}, unloadTimeout {:g}s, startPort {}, api keys: {}".format(
                f"{self.health_check_timeout:g}",
                _ttl_text(self.global_ttl),
                self.unload_timeout,
                self.start_port,
                len(self.api_keys) or "none in the file (`llamaswap keys list` shows the rest)",
            ),
        ]
        if self.preload:
            lines.append(f"preload: {', '.join(self.preload)}")
        if self.hardware is not None:
            lines.append(_hardware_text(self.hardware, alone=not self.groups and self.matrix is None))
        group_of = {member: group.name for group in self.groups for member in group.members}
        if self.matrix is not None:
            lines.append("router: matrix (a model in no set runs alone)")
            for matrix_set in self.matrix.sets:
                combinations = " | ".join("[" + ", ".join(sorted(c)) + "]" for c in matrix_set.combinations)
                lines.append(f"set {matrix_set.name}: {combinations}")
        for group in self.groups:
            flags = [flag for flag, on in (("swap", group.swap), ("exclusive", group.exclusive), ("persistent", group.persistent)) if on]
            lines.append(f"group {group.name} ({', '.join(flags) or 'no flags'}): {', '.join(group.members) or '-'}")
        for selector in self.selectors.values():
            lines.append(f"selector {selector.id} ({selector.strategy}): {', '.join(selector.targets)}")
        for profile in self.profiles.values():
            pins = ", ".join(f"{pinned} → {target or 'disabled'}" for pinned, target in profile.pins.items())
            lines.append(f"profile {profile.name}: {pins or 'no pins'}")
        lines.append(f"models ({len(self.models)}):")
        for model in self.models.values():
            extras = []
            if model.aliases:
                extras.append(f"aliases: {', '.join(model.aliases)}")
            if self.matrix is not None:
                extras.append(f"evict cost: {self.matrix.evict_cost(model.id)}")
            elif self.groups or self.hardware is None:
                extras.append(f"group: {group_of.get(model.id, '(default)')}")
            if model.memory is not None:
                extras.append(_memory_text(model.memory))
            if model.pinned:
                extras.append("pinned")
            if model.min_residency:
                extras.append(f"minResidency {model.min_residency:g}s")
            if model.unlisted:
                extras.append("unlisted")
            lines.append(f"  {model.id}  [{'; '.join(extras)}]")
            lines.append(f"    cmd:   {shlex.join(shown_argv(model.cmd)) or '(none: each request for it gets 503)'}")
            lines.append(f"    proxy: {shown_url(model.proxy)}  ttl: {_ttl_text(model.ttl)}")
        for peer in self.peers.values():  # relayed as they come, never scheduled
            key = ", apiKey set" if peer.api_key else ""
            lines.append(f"peer {peer.id} ({shown_url(peer.proxy)}{key}): {', '.join(peer.models)}")
        return "\n".join(lines)


def _ttl_text(ttl: float) -> str:
    return "never" if ttl == 0 else f"{ttl:g}s"


def _hardware_text(hardware: Hardware, alone: bool) -> str:
    gpus = ", ".join(f"GPU {gpu} {mib} MiB" for gpu, mib in hardware.gpus.items())
    cpu = "not counted" if hardware.cpu_mib is None else f"{hardware.cpu_mib} MiB"
    decides = "memory alone decides what runs together" if alone else "memory and the router both decide what runs together"
    return f"hardware: {gpus}; CPU {cpu} ({decides})"


def _memory_text(need: MemoryNeed) -> str:
    if need.gpus == 0:
        return f"memory: {need.mib} MiB of the CPU's"
    return f"memory: {need.mib} MiB on each of {need.gpus} GPUs" if need.gpus > 1 else f"memory: {need.mib} MiB on 1 GPU"


def read_config_text(path: str | os.PathLike) -> str:
    """A config file's text; raises ConfigError naming it when it is missing or unreadable."""
    try:
        with open(path, encoding="utf-8") as file:
            return file.read()
    except FileNotFoundError:
        raise ConfigError(path, [Problem("", "file not found — check the path given with --config")]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(path, [Problem("", f"cannot be read ({exc}) — check its permissions and that it is UTF-8 text")]) from None


def parse_config(text: str, path: str = "<string>", kept_ports: Mapping[str, int] | None = None) -> Config:
    """Check config text; `path` is only used in messages.

    healthCheckTimeout below 15 s is raised to 15 s as in llama-swap, unless the
    environment sets LLAMASWAP_ALLOW_SHORT_HEALTH_TIMEOUT=1 (for tests that
    want a dead upstream to fail fast).
    """
    log = ProblemLog(path)
    return check_document(read_yaml_document(text, log), log, kept_ports)


def check_document(data, log: ProblemLog, kept_ports: Mapping[str, int] | None = None) -> Config:
    """Check a config already read from YAML (one file's, or several merged); `log.path` names it in messages.
    `kept_ports` (a reload's: the ${PORT} numbers in force) are given again to the same models where they still
    fall from startPort on; the other models take the free numbers in ID order."""
    path = log.path
    if data is None:
        log.raise_if_any()  # no document to check further; unset ${env.*} values do not stop the checks
    if not isinstance(data, dict):
        log.error("", f"the top level must be a mapping of settings, got {kind_of(data)} — start the file with `models:`")
        log.raise_if_any()

    top = Section(data, "", log)
    top.scope = MacroScope.declare(top.raw("macros", None), "macros", log)
    health_check_timeout = _read_health_check_timeout(top)
    start_port = top.integer("startPort", DEFAULT_START_PORT, minimum=1, maximum=65535, example="5800")
    global_ttl = top.number("globalTTL", 0, minimum=0, example="300")
    unload_timeout = top.number("unloadTimeout", 0, minimum=0, example="10") or DEFAULT_UNLOAD_TIMEOUT
    send_loading_state = top.boolean("sendLoadingState", False)
    hardware = read_hardware(top)
    models = _read_models(top, start_port, ModelDefaults(global_ttl, unload_timeout, send_loading_state, hardware),
                          kept_ports or {})
    warn_unfitting_pins(hardware, {m.id: m.memory for m in models.values() if m.pinned and m.memory}, log)
    index = ModelIndex(models, log)
    routing = top.section("routing")
    router = read_router(top, routing, index)
    scheduler = read_scheduler(routing, index, placing=hardware.given)
    if routing is not None:
        routing.warn_unread()
    api_keys = _read_api_keys(top)
    log_level = _read_log_level(top)
    max_request_body_bytes = top.integer(
        "maxRequestBodyBytes", DEFAULT_MAX_REQUEST_BODY_BYTES, minimum=1, example=str(DEFAULT_MAX_REQUEST_BODY_BYTES)
    )
    metrics_require_api_key = top.boolean("metricsRequireApiKey", False)
    include_aliases_in_list = top.boolean("includeAliasesInList", False)
    ignore_paths = read_ignore_paths(top)
    log_output = read_log_output(top)
    capture_buffer_mb = top.number("captureBuffer", 0, minimum=0, example="5")
    max_batch_file_bytes = top.integer("maxBatchFileBytes", DEFAULT_MAX_BATCH_FILE_BYTES, minimum=1,
                                       example=str(DEFAULT_MAX_BATCH_FILE_BYTES))
    max_batch_storage_bytes = top.integer("maxBatchStorageBytes", 0, minimum=0, example="10737418240")
    max_batch_file_lines = top.integer("maxBatchFileLines", 50_000, minimum=1, maximum=10_000_000, example="50000")
    peers = read_peers(top)
    warn_shadowed(peers, lambda name: index.resolve(name) is not None, log)
    performance = read_performance(top)
    peer_models = PeerModels(peers)

    def is_peer_model(name: str) -> bool:
        return peer_models.find(name) is not None

    selectors = read_selectors(
        top, index, together=coexistence_check(router.groups, router.matrix, models),
        peer_model=is_peer_model, peer_ids=peers,
    )
    profiles = read_profiles(top, index, selector_ids=selectors, peer_model=is_peer_model)
    preload, startup_profile = _read_startup_hooks(top, index, profiles)
    # llama-swap remembers the selected profile in this file; llamaswap keeps it in its database already.
    remember_profile = bool(top.text("profileStateFile").strip())
    top.warn_unread(notes=TOP_KEY_NOTES, meant=TOP_KEYS_MEANT)
    log.raise_if_any()

    return Config(
        path=path,
        models=MappingProxyType(models),
        groups=router.groups,
        health_check_timeout=health_check_timeout,
        start_port=start_port,
        global_ttl=global_ttl,
        unload_timeout=unload_timeout,
        api_keys=api_keys,
        log_level=log_level,
        preload=preload,
        scheduler=scheduler,
        max_request_body_bytes=max_request_body_bytes,
        metrics_require_api_key=metrics_require_api_key,
        warnings=tuple(log.warnings),
        aliases=MappingProxyType(index.aliases()),
        matrix=router.matrix,
        include_aliases_in_list=include_aliases_in_list,
        ignore_paths=ignore_paths,
        log_output=log_output,
        peers=MappingProxyType(peers),
        performance=performance,
        selectors=MappingProxyType(selectors),
        profiles=MappingProxyType(profiles),
        capture_buffer_mb=capture_buffer_mb,
        max_batch_file_bytes=max_batch_file_bytes,
        max_batch_storage_bytes=max_batch_storage_bytes,
        max_batch_file_lines=max_batch_file_lines,
        startup_profile=startup_profile,
        remember_profile=remember_profile,
        hardware=hardware.hardware,
    )


def _read_health_check_timeout(top: Section) -> float:
    timeout = top.number("healthCheckTimeout", DEFAULT_HEALTH_CHECK_TIMEOUT, example="120")
    if os.environ.get(SHORT_HEALTH_TIMEOUT_ENV) == "1":
        if timeout <= 0:
            top.error("healthCheckTimeout", f"{timeout:g} must be above 0 — e.g. healthCheckTimeout: 5")
            return DEFAULT_HEALTH_CHECK_TIMEOUT
        return timeout
    if timeout < MIN_HEALTH_CHECK_TIMEOUT:
        top.log.warn(
            "healthCheckTimeout",
            f"{timeout:g} is below the minimum of {MIN_HEALTH_CHECK_TIMEOUT:g} seconds, using {MIN_HEALTH_CHECK_TIMEOUT:g}",
        )
        return MIN_HEALTH_CHECK_TIMEOUT
    return timeout


def _read_models(top: Section, start_port: int, defaults: ModelDefaults,
                 kept_ports: Mapping[str, int]) -> dict[str, ModelConfig]:
    """Models sorted by ID; ${PORT} numbers are handed out in that order, so they are stable. A reload keeps each
    model's number (`kept_ports`): a model added or removed would otherwise renumber, and so restart, every model
    after it, however long it took to load."""
    entries = top.raw("models")
    if entries is MISSING or entries is None:
        top.error("models", "missing — add a `models:` section with at least one model and its cmd")
        return {}
    if not isinstance(entries, dict):
        top.error("models", f"expected a mapping of model ID: settings, got {kind_of(entries)}")
        return {}
    if not entries:
        top.log.warn("models", "no models are defined — every request will be answered 404")

    kept = {model: port for model, port in kept_ports.items() if model in entries and start_port <= port <= 65535}
    taken = set(kept.values())
    next_port = start_port
    handed = 0

    def allocate_port(model_id: str) -> int:
        nonlocal next_port, handed
        handed += 1
        if model_id in kept:
            return kept[model_id]
        while next_port in taken:
            next_port += 1
        next_port += 1
        return next_port - 1

    models: dict[str, ModelConfig] = {}
    for raw_id in entries:
        if not isinstance(raw_id, str) or not raw_id:
            top.log.error(f"models.{raw_id}", f'a model ID must be non-empty text, got {kind_of(raw_id)} — quote it: "{raw_id}":')
    for model_id in sorted(key for key in entries if isinstance(key, str) and key):
        model = read_model(model_id, entries[model_id], top.scope, defaults, partial(allocate_port, model_id),
                           top.log)
        if model is not None:
            models[model_id] = model
    if next_port - 1 > 65535:
        top.error("startPort", f"{start_port} leaves too few ports for the {handed} models that use ${{PORT}} — lower startPort")
    return models


def _read_api_keys(top: Section) -> tuple[str, ...]:
    keys = top.text_list("apiKeys", example='"sk-…"')
    usable = []
    for position, api_key in enumerate(keys):
        key = f"apiKeys[{position}]"
        if not api_key:
            top.log.error(key, "empty API key — remove the entry or set a key (its env variable may be empty)")
        elif any(char.isspace() for char in api_key):
            top.log.error(key, "API keys cannot contain spaces — clients send them in one header token; remove the whitespace")
        elif not api_key.isascii():
            top.log.error(key, "API keys must be ASCII — a header carries no other characters, so no client could "
                               "send this key; use letters, digits and punctuation")
        else:
            usable.append(api_key)
    return tuple(usable)


def _read_log_level(top: Section) -> str:
    level = top.text("logLevel", "info")
    if level not in LOG_LEVELS:
        top.error("logLevel", f'"{level}" is not a log level — use one of: {", ".join(LOG_LEVELS)}')
        return "info"
    return level


def _read_startup_hooks(top: Section, index: ModelIndex, profiles: Mapping[str, ProfileConfig]) -> tuple[tuple[str, ...], str]:
    """`hooks.on_startup`: the models to `preload` and the `profile` to make active."""
    hooks = top.section("hooks")
    on_startup = hooks.section("on_startup") if hooks else None
    names = on_startup.text_list("preload", example="model-a") if on_startup else ()
    preload: list[str] = []
    for position, name in enumerate(names):
        name = name.strip()
        real = index.resolve(name)
        if not name:
            continue
        if real is None:
            top.log.error(f"hooks.on_startup.preload[{position}]", index.unknown(name))
        elif real not in preload:
            preload.append(real)
    profile = on_startup.text("profile").strip() if on_startup else ""
    if profile and profile not in profiles:
        known = ", ".join(sorted(profiles)) or "none are defined"
        on_startup.error("profile", f'"{profile}" is not a profile — name one under `profiles:` ({known})')
        profile = ""
    for section in (on_startup, hooks):
        if section is not None:
            section.warn_unread()
    return tuple(preload), profile
