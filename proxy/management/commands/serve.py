"""`llamaswap serve --config FILE --listen HOST:PORT`: migrate, recover, then run daphne in the foreground."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import signal
import sys

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

log = logging.getLogger("llamaswap.serve")


def parse_listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit():
        raise CommandError(f"--listen {value!r}: expected HOST:PORT, e.g. 127.0.0.1:8080")
    return host.strip("[]") or "0.0.0.0", int(port)


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


class Command(BaseCommand):
    help = "Serve the OpenAI-compatible proxy and the admin with the given llama-swap config."

    def add_arguments(self, parser):
        parser.add_argument("--config", required=True, help="llama-swap config.yaml")
        parser.add_argument("--listen", default="127.0.0.1:8080", help="HOST:PORT (default 127.0.0.1:8080)")
        parser.add_argument("--no-migrate", action="store_true", help="do not apply database migrations first")
        parser.add_argument("--check", action="store_true", help="validate and print the config, then exit")
        parser.add_argument(
            "--watch-config", action="store_true",
            help="reload the config when the file changes (checked every 2 s); SIGHUP always reloads",
        )
        parser.add_argument(
            "--drain-seconds", type=float, default=30.0,
            help="on SIGTERM/SIGINT, how long running requests may finish before models are stopped (default 30)",
        )

    def handle(self, *args, **options):
        from proxy.config import ConfigError, load_config

        path = os.path.abspath(options["config"])
        try:
            config = load_config(path)
        except ConfigError as exc:
            self.stderr.write(str(exc))
            sys.exit(2)
        except OSError as exc:
            self.stderr.write(f"{path}: cannot read the config file: {exc.strerror}")
            sys.exit(2)
        for warning in config.warnings:
            self.stderr.write(f"warning: {warning}")
        self.stdout.write(config.describe())
        if options["check"]:
            return
        settings.LLAMASWAP_CONFIG = path
        os.environ["LLAMASWAP_CONFIG"] = path
        host, port = parse_listen(options["listen"])
        if not options["no_migrate"]:
            call_command("migrate", interactive=False, verbosity=0)
        from proxy.service import prepare

        prepare(config)
        self._suggest_admin_user()
        if not is_loopback(host):
            self.stderr.write(f"warning: listening on {host}, reachable from other machines; set apiKeys")
        self._run_daphne(host, port, options["drain_seconds"], path if options["watch_config"] else None)

    def _suggest_admin_user(self) -> None:
        from django.contrib.auth import get_user_model

        if not get_user_model().objects.filter(is_superuser=True).exists():
            self.stdout.write("No admin user yet: create one with `llamaswap createsuperuser`, then open /admin/.")

    def _run_daphne(self, host: str, port: int, drain_seconds: float, watch: str | None) -> None:
        from daphne.server import Server
        from twisted.internet import reactor

        from llamaswap_site.asgi import application
        from proxy.reload import reload_config, watch_config
        from proxy.service import get_service

        interface = host.replace(":", r"\:")
        server = Server(
            application,
            # A deep accept backlog: hundreds of clients may connect at once to wait in the queue.
            endpoints=[f"tcp:port={port}:interface={interface}:backlog=2048"],
            signal_handlers=False,
            verbosity=0,
        )
        stopping: list[asyncio.Task] = []
        background: list[asyncio.Task] = []

        async def stop(signame: str) -> None:
            self.stdout.write(f"{signame}: finishing in-flight requests (up to {drain_seconds:g}s), stopping models")
            for task in background:
                task.cancel()
            try:
                await get_service().shutdown(drain_seconds)
            finally:
                reactor.stop()

        def on_signal(signame: str) -> None:
            if stopping:
                return
            stopping.append(asyncio.ensure_future(stop(signame)))

        def started() -> None:
            try:
                loop = asyncio.get_running_loop()
                for sig in (signal.SIGTERM, signal.SIGINT):
                    loop.add_signal_handler(sig, on_signal, sig.name)
                service = get_service()
                loop.add_signal_handler(
                    signal.SIGHUP, lambda: asyncio.ensure_future(reload_config(service, settings.LLAMASWAP_CONFIG))
                )
                if watch:
                    background.append(asyncio.ensure_future(watch_config(service, watch)))
                service.start()
            except Exception:
                log.exception("llamaswap could not start")
                reactor.stop()
                raise
            self.stdout.write(f"llamaswap serving on http://{host}:{port} (scheduler: {service.config.scheduler.use})")
            self.stdout.flush()

        # Twisted runs `callWhenRunning` callbacks before the asyncio loop spins; call_soon waits for it.
        reactor.callWhenRunning(lambda: reactor._asyncioEventloop.call_soon(started))
        server.run()
