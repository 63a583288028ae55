"""`llamaswap worker --config FILE [--config-dir DIR] [--advertise HOST]`: the scheduler and the model processes of one GPU
box, serving the front ends of distributed mode over the channel layer."""

from __future__ import annotations

import asyncio
import signal

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

# Loopback: the port has no API key; a Prometheus on another machine needs 0.0.0.0:9101 (or the box's address).
METRICS_LISTEN = "127.0.0.1:9101"


class Command(BaseCommand):
    help = "Run this machine's scheduler and model processes for the front ends (distributed mode: REDIS_URL)."

    def add_arguments(self, parser):
        parser.add_argument("--config", help="llama-swap config.yaml (the same file the front ends serve)")
        parser.add_argument(
            "--config-dir", help="a directory whose *.yaml/*.yml files are merged after --config (as the front ends')"
        )
        parser.add_argument(
            "--advertise", default=None, metavar="HOST",
            help="the name or address front ends reach this machine's model servers at "
            "(default: the addresses in the config, e.g. 127.0.0.1 when front ends run on this machine)",
        )
        parser.add_argument("--no-migrate", action="store_true", help="do not apply database migrations first")
        parser.add_argument(
            "--drain-seconds", type=float, default=30.0,
            help="on SIGTERM/SIGINT, how long running requests may finish before models are stopped (default 30)",
        )
        parser.add_argument(
            "--metrics-listen", default=METRICS_LISTEN, metavar="HOST:PORT",
            help=f"where Prometheus scrapes the scheduler's series: queue, dispatches, models, slots (default "
            f"{METRICS_LISTEN}; 0.0.0.0:PORT for a Prometheus on another machine; 'off' to serve none)",
        )

    def handle(self, *args, **options):
        from proxy.model_processes.log_level import apply_log_level
        from proxy.model_processes.log_output import apply_log_output
        from proxy.management.config_file import read_config, serve_config_from

        if not settings.CHANNEL_LAYERS:
            raise CommandError(
                "llamaswap worker serves front ends over Redis: set REDIS_URL=redis://host:6379/0 and a PostgreSQL "
                "DATABASE_URL (the same for the front ends); without them, `llamaswap serve` runs everything in one process"
            )
        if not options["config"] and not options["config_dir"]:
            raise CommandError("no config: pass --config FILE, --config-dir DIR, or both", returncode=2)
        config = read_config(self, options["config"], config_dir=options["config_dir"])
        serve_config_from(options["config"], options["config_dir"])
        apply_log_level(config.log_level)
        apply_log_output(config.log_output)
        from proxy.model_processes.instance_lock import InstanceLockError, hold_instance_lock

        try:
            # One worker per set of models: the set's standby waits here; other GPU boxes' workers do not.
            hold_instance_lock(role="worker", models=list(config.models), standby=self._standing_by)
        except InstanceLockError as exc:
            raise CommandError(str(exc)) from None
        # Before touching anything: a worker that cannot serve its metrics stops before it stops any process.
        # A standby that took over carries on without them instead: its box would otherwise have no worker.
        self._serve_metrics(options["metrics_listen"], fatal=not self._stood_by)
        if not options["no_migrate"]:
            call_command("migrate", interactive=False, verbosity=0)
        from proxy.service import prepare
        from scheduling.rows.recovery import carried_requests, interrupted_requests, let_go_requests
        from scheduling.door.ticket_ids import shared_ticket_ids
        from scheduling.door.worker import ANSWERED_KEYS

        prepared = prepare(config, worker=True)
        carried = carried_requests(list(config.models))
        interrupted = interrupted_requests(list(config.models))
        let_go = let_go_requests(list(config.models), ANSWERED_KEYS)
        ticket_ids = shared_ticket_ids(prepared.first_ticket_id)
        asyncio.run(self._work(
            prepared, carried, interrupted, let_go, ticket_ids, options["advertise"], options["drain_seconds"]
        ))

    _stood_by = False

    def _standing_by(self, why: str) -> None:
        self._stood_by = True
        self.stdout.write(f"llamaswap worker standing by: {why}")
        self.stdout.flush()

    async def _work(
        self, prepared, carried: list, interrupted: list, let_go: tuple, ticket_ids, advertise: str | None,
        drain_seconds: float,
    ) -> None:
        from channels.layers import get_channel_layer

        from proxy.reload import reload_config
        from proxy.service import ProxyService, serve_here
        from scheduling.door.in_process import InProcessFrontDoor
        from scheduling.door.worker import SchedulerWorker

        loop = asyncio.get_running_loop()
        service = ProxyService(
            prepared.config, prepared.first_ticket_id, prepared.serial_settings, front_door=InProcessFrontDoor,
            ticket_ids=ticket_ids, durations=prepared.durations,
        )
        serve_here(service)
        worker = SchedulerWorker(service.door, get_channel_layer(), prepared.config.models, advertise=advertise)
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        loop.add_signal_handler(signal.SIGHUP, lambda: loop.create_task(reload_config(
            service, settings.LLAMASWAP_CONFIG or None, settings.LLAMASWAP_CONFIG_DIR or None
        )))
        service.start()
        worker.rebuild(carried)  # before the first message, so a front end's second submit finds its request here
        worker.expect_ends(interrupted)  # and a front end's report of a stream's end finds its row
        worker.take_back(*let_go)  # and a front end taken for dead that comes back keeps its requests
        serving = loop.create_task(worker.run())
        self.stdout.write(
            f"llamaswap worker serving the front ends (scheduler: {service.config.scheduler.use}; "
            f"{len(carried)} queued requests taken over)"
        )
        self.stdout.flush()
        await stop.wait()
        handed = worker.hand_over()
        self.stdout.write(
            f"leaving {handed} queued requests for the next worker; finishing in-flight requests "
            f"(up to {drain_seconds:g}s), stopping models"
        )
        await service.shutdown(drain_seconds)
        await worker.stop()
        await serving

    def _serve_metrics(self, listen: str, fatal: bool) -> None:
        """The worker has no HTTP server, so its Prometheus series get a port of their own."""
        from proxy.api import worker_metrics
        from proxy.management.commands.serve import parse_listen

        if listen.lower() in ("off", ""):
            return
        host, port = parse_listen(listen, "--metrics-listen")
        try:
            worker_metrics.serve(host, port)
        except OSError as exc:
            problem = (
                f"cannot serve metrics on {host}:{port}: {exc.strerror or exc} "
                "(choose another port with --metrics-listen HOST:PORT, or --metrics-listen off)"
            )
            if fatal:
                raise CommandError(problem) from None
            self.stderr.write(f"{problem}; serving the front ends without metrics")
            return
        self.stdout.write(f"metrics for Prometheus at http://{host}:{port}/metrics")
