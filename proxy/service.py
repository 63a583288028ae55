"""Wiring: one service per process holds the config, the fleet, the scheduler runtime and the recorder.

daphne has no lifespan hook, so the service is built on the event loop the
first time something needs it (`llamaswap serve` does that before the first
request). The database work that must happen before serving — marking rows a
previous run left unfinished, stopping model processes it left behind — is
done synchronously by `prepare()`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from dataclasses import dataclass

from channels.layers import get_channel_layer

from proxy.upstream import captures

from proxy.model_processes import system_metrics
from proxy.serving.errors import ProxyError
from proxy.model_processes import gpu_memory
from proxy.model_processes.fleet import ProcessFleet
from proxy.upstream.peer_relay import PeerRelays
from proxy.serving.upstream_names import leading_names
from proxy.upstream.clients import ClientUse, UpstreamClients
from scheduling.door import frontdoor
from scheduling.door.layer_task_errors import report_loop_error
from scheduling import metrics
from scheduling.operating.config_inputs import model_specs, swap_policy
from scheduling.core import SerialSettings, build_scheduler
from scheduling.core.durations import DurationHistory
from scheduling.rows.recorder import Recorder
from scheduling.runtime import SchedulerRuntime
from scheduling.tickets import Outcome, Refused, RequestState, TicketRequest

log = logging.getLogger("llamaswap.service")

# What a peer request still running when the shutdown's drain is over is told, as a local one is by the runtime.
SHUT_DOWN = Refused(503, "shutting_down", "llamaswap shut down before this request finished")

# The longest leading name of an /upstream/ path looked for among a key's globs when no model is configured there:
# bounded, as the names tried cost their length each, and a path may be long.
SCOPED_NAME_MAX = 256


@dataclass(frozen=True)
class Prepared:
    config: object
    first_ticket_id: int
    serial_settings: SerialSettings  # the config's values with the admin's stored overrides
    durations: DurationHistory | None = None  # typical job and load times, from the rows


_prepared: Prepared | None = None
_service: ProxyService | None = None


def load_configured():
    """The config named by settings.LLAMASWAP_CONFIG (and LLAMASWAP_CONFIG_DIR)."""
    from django.conf import settings

    from proxy.config import load_config

    if not settings.LLAMASWAP_CONFIG and not settings.LLAMASWAP_CONFIG_DIR:
        raise RuntimeError("no config file: run `llamaswap serve --config FILE` (or set LLAMASWAP_CONFIG)")
    return load_config(settings.LLAMASWAP_CONFIG or None, settings.LLAMASWAP_CONFIG_DIR or None)


def prepare(config=None, *, worker: bool = False) -> Prepared:
    """Load the config and recover from a previous run. Synchronous: call it before serving.

    Recovery treats what is unfinished as left behind and takes the next ticket id from the table,
    which is right only while no other service uses the data: call it holding the instance lock
    (`llamaswap serve` takes it before migrating; `get_service()` before preparing). A `worker` in
    distributed mode recovers only its own models, and keeps the queued rows of front ends, to serve
    them (`carried_requests`).
    """
    from proxy.serving.active_profile import start_profile, start_with_profile
    from proxy.model_processes.orphans import stop_orphaned_model_processes
    from scheduling.rows.recovery import recover_previous_run
    from scheduling.rows.durations import durations_from_rows
    from scheduling.operating.settings_store import stored_serial_settings

    global _prepared
    config = config or load_configured()
    own = list(config.models) if worker else None
    stop_orphaned_model_processes(own)
    next_id = recover_previous_run(worker_models=own)
    if worker:  # in distributed mode the profile belongs to the whole deployment: only a reload resets it
        start_with_profile(config)
    else:
        start_profile(config)
    _prepared = Prepared(
        config, next_id, stored_serial_settings(config.scheduler.serial, config.models), durations_from_rows(config.models)
    )
    return _prepared


def prepare_front_end(config) -> Prepared:
    """A front end in distributed mode recovers nothing: the worker owns the rows and the models."""
    from scheduling.operating.settings_store import stored_serial_settings

    global _prepared
    _prepared = Prepared(config, 0, stored_serial_settings(config.scheduler.serial, config.models))
    return _prepared


def serve_here(service: ProxyService) -> None:
    """Make `service` this process's service (a worker builds its own, with the scheduler in it)."""
    global _service
    _service = service


def get_service() -> ProxyService:
    """The process's service, built on the running event loop at first use."""
    global _service
    if _service is None:
        prepared = _prepared
        if prepared is None:
            with concurrent.futures.ThreadPoolExecutor(1) as pool:  # DB work must not run on the loop thread
                prepared = pool.submit(_prepare_locked).result()
        _service = ProxyService(
            prepared.config, prepared.first_ticket_id, prepared.serial_settings, durations=prepared.durations
        )
    return _service


def _prepare_locked() -> Prepared:
    from proxy.model_processes.instance_lock import hold_instance_lock

    hold_instance_lock()
    return prepare()


def reset_service() -> None:
    """Forget the process's service (tests that build several in one process)."""
    global _service, _prepared
    _service = None
    _prepared = None
    frontdoor.install(None)
    metrics.EXPORT.only = None


def config_for_pages():
    """The configured file, for pages of a process that does not serve (see `frontdoor.current_config`)."""
    from proxy.config import ConfigError

    try:
        return load_configured()
    except (RuntimeError, ConfigError) as exc:
        raise frontdoor.ConfigUnavailable(str(exc)) from None


class ProxyService:
    """What one process serves. Where the scheduler runs in this process (the embedded default, and a
    `llamaswap worker`), it owns the recorder, the model processes and the runtime; a front end in
    distributed mode has none of them and reaches the worker's scheduler through its front door."""

    def __init__(
        self, config, first_ticket_id: int = 1, serial_settings: SerialSettings | None = None, front_door=None,
        ticket_ids=None, durations: DurationHistory | None = None,
    ):
        self.config = config
        door_class = front_door or frontdoor.front_door_class()
        if door_class.runs_scheduler:
            self.recorder = Recorder()
            self.recorder.start()
            self.fleet = ProcessFleet(config, self.recorder, on_crash=self._model_crashed)
            scheduler = build_scheduler(
                config.scheduler.use, model_specs(config), swap_policy(config), serial_settings or config.scheduler.serial,
                config.hardware,
            )
            self.runtime = SchedulerRuntime(
                scheduler, self.fleet, self.recorder, first_ticket_id=first_ticket_id, ticket_ids=ticket_ids,
                observer=metrics.record_event, durations=durations,
            )
            metrics.export_service(self.runtime, self.fleet, config)
            self.door = door_class(self.runtime, self.fleet, config)
        else:
            self.recorder = self.fleet = self.runtime = None
            self.door = door_class(config, get_channel_layer(), observer=metrics.record_event)
            metrics.export_front_end(config)
            metrics.EXPORT.only = metrics.FRONT_END
        frontdoor.install(self.door)
        captures.STORE.configure(config.capture_buffer_mb)
        self._clients = UpstreamClients()
        self._background = _Tasks()
        self.peer_relays = PeerRelays()

    def start(self) -> None:
        """Begin background work: sample the machine for /metrics (`performance:`) where the models run, and
        load `hooks.on_startup.preload` models, one at a time, through the scheduler."""
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(report_loop_error)  # a layer task cut by a Redis outage: one line, no traceback
        if self.runtime is not None:  # a front end's machine runs no model: the worker exports its machine's
            system_metrics.SAMPLER.configure(self.config.performance)
            self._background.add(loop.create_task(self.runtime.model_leases.run()))
            self._measure_gpu_memory()
        if self.config.preload:
            self._background.add(loop.create_task(self.load(*self.config.preload, why="preload")))

    def _measure_gpu_memory(self) -> None:
        """Measure what the models use of GPU memory where nvidia-smi exists (see `gpu_memory`)."""
        command = gpu_memory.nvidia_smi_command()
        if command is None:
            if self.config.hardware is not None:
                log.info("no nvidia-smi (on PATH, or %s): GPU memory is not measured", gpu_memory.COMMAND_SETTING)
            return
        watch = gpu_memory.GpuMemoryWatch(command, self.fleet, self.runtime.memory_measured)
        self.fleet.measure_started = watch.measure_started
        self._background.add(asyncio.get_running_loop().create_task(watch.run()))

    async def load(self, *models: str, why: str) -> None:
        """Load `models`, one at a time, through the scheduler (a preload)."""
        for model in models:
            try:
                lease = await self.door.submit(TicketRequest(model=model, path=f"({why})", priority=0, method="LOAD"))
            except Refused as exc:
                log.warning("loading %s (%s) failed: %s", model, why, exc.message)
                continue
            self.door.release(lease.ticket_id, Outcome(state=RequestState.COMPLETED, status_code=200))

    def apply_config(self, config, restart: list[str], serial_settings: SerialSettings) -> None:
        """Switch to a reloaded config; `restart` names models whose process must be replaced.

        Requests in flight keep the client they started with: a model whose process or timeouts
        changed (or that was added or removed) gets a new client for its next request.
        """
        old = self.config.models
        old_peers = self.config.peers
        self.config = config
        self.door.config = config
        captures.STORE.configure(config.capture_buffer_mb)
        if self.runtime is not None:
            self.fleet.apply(config, restart)
            self.runtime.operators.reconfigure(model_specs(config), swap_policy(config), restart, config.hardware)
            self.runtime.operators.retune(serial_settings)
        for model in set(old) | set(config.models):
            before, after = old.get(model), config.models.get(model)
            if model in restart or before is None or after is None or before.timeouts != after.timeouts:
                self._clients.retire(model)
        for peer in set(old_peers) | set(config.peers):
            if old_peers.get(peer) != config.peers.get(peer):
                self._clients.retire(("peer", peer))
        if self.runtime is not None:
            metrics.export_service(self.runtime, self.fleet, config)
            system_metrics.SAMPLER.configure(config.performance)
        else:
            metrics.export_front_end(config)

    def _model_crashed(self, model: str) -> None:
        self.runtime.model_exited(model)

    def resolve_model(self, name: str, scope=None, asked: str | None = None):
        """The model `name` (an ID or an alias) names. With the caller's key `scope`, a name the key may not use is
        refused 403 whether or not it is configured, and named as asked (`asked`, the client's name before a
        profile's pin or a selector led to `name`; not an alias's model), so a key's answers say nothing of the
        models outside it."""
        model = self.config.resolve(name)
        if scope is not None and not scope.allows_model(name if model is None else model.id):
            raise ProxyError(403, f"the API key '{scope.name}' may not use model '{asked or name}'",
                             "model_not_allowed")
        if model is None:
            raise ProxyError(404, f"model '{name}' is not configured; GET /v1/models lists the available models", "model_not_found")
        return model

    def resolve_upstream_path(self, rest: str, scope=None, asked: str | None = None):
        """`<model>/<path>` → (model config, path); model IDs may contain '/', so the longest match wins.

        The path is None when the request named just the model (`/upstream/<model>`), which
        is answered with a redirect that adds the trailing slash. With the caller's key `scope`, a path whose model
        the key may not use is refused 403 whether or not a model is configured there (404 only where its globs
        match a leading name of at most SCOPED_NAME_MAX characters), in one wording that names the path as asked
        (`asked`, before a profile's pin), not the model: the key learns nothing of the models outside its scope.
        """
        longest = max(map(len, [*self.config.models, *self.config.aliases]), default=0)
        for name, remainder in leading_names(rest, longest):
            model = self.config.resolve(name)
            if model is not None:
                if scope is not None and not scope.allows_model(model.id):
                    raise self._not_the_keys(scope, asked or rest)
                return model, remainder
        if scope is not None and not any(scope.allows_model(name)
                                         for name, _ in leading_names(rest, max(longest, SCOPED_NAME_MAX))):
            raise self._not_the_keys(scope, asked or rest)
        raise ProxyError(404, f"no configured model matches /upstream/{rest}", "model_not_found")

    @staticmethod
    def _not_the_keys(scope, rest: str) -> ProxyError:
        return ProxyError(403, f"the API key '{scope.name}' may not use the model at /upstream/{rest}",
                          "model_not_allowed")

    def client_for(self, model) -> ClientUse:
        """`async with` it for the keep-alive client that reaches `model` (a model config) for one request."""
        return self._clients.use(model.id, model.timeouts)

    def client_for_peer(self, peer) -> ClientUse:
        """`async with` it for the keep-alive client that reaches `peer` (a peer config) for one request."""
        return self._clients.use(("peer", peer.id), peer.timeouts)

    async def shutdown(self, drain_seconds: float) -> None:
        """Drain in-flight work within the budget, stop every model, flush the rows."""
        system_metrics.SAMPLER.stop()
        self._background.cancel()
        if self.runtime is None:
            await self.peer_relays.cut(SHUT_DOWN)
            await self.door.close()
            await self._clients.aclose()
            return
        await self.runtime.shutdown(drain_seconds)
        await self.peer_relays.cut(SHUT_DOWN)  # the drain also waited for them
        await self.fleet.stop_all()
        await self._clients.aclose()
        await asyncio.get_running_loop().run_in_executor(None, self.recorder.close)


class _Tasks(set):
    """The service's background tasks (the lease keeper, loads): each forgets itself when done; all are
    cancelled at shutdown."""

    def add(self, task: asyncio.Task) -> None:
        super().add(task)
        task.add_done_callback(self.discard)

    def cancel(self) -> None:
        for task in list(self):
            task.cancel()
