"""`llamaswap serve --config FILE [--config-dir DIR] --listen HOST:PORT [--tls-cert-file C --tls-key-file K]`:
migrate, recover, then run daphne in the foreground."""

from __future__ import annotations

import asyncio
import logging
import os
import shlex
import signal
import sys

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

log = logging.getLogger("llamaswap.serve")


def parse_listen(value: str, option: str = "--listen") -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep:
        raise CommandError(f"{option} {value!r}: expected HOST:PORT, e.g. 127.0.0.1:8080")
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        raise CommandError(f"{option} {value!r}: the port must be a number from 1 to 65535")
    return host.strip("[]") or "0.0.0.0", int(port)


class Command(BaseCommand):
    help = "Serve the OpenAI-compatible proxy and the admin with the given llama-swap config."

    def get_version(self) -> str:
        from proxy.version import llamaswap_version

        return f"llamaswap {llamaswap_version()}"

    def add_arguments(self, parser):
        parser.add_argument("--config", help="llama-swap config.yaml (this, --config-dir, or both)")
        parser.add_argument(
            "--config-dir",
            help="a directory whose top-level *.yaml/*.yml files are merged after --config, in filename order",
        )
        parser.add_argument("--listen", default="127.0.0.1:8080", help="HOST:PORT (default 127.0.0.1:8080, also with TLS)")
        parser.add_argument("--tls-cert-file", help="serve HTTPS with this PEM certificate (with --tls-key-file)")
        parser.add_argument("--tls-key-file", help="the certificate's PEM private key (with --tls-cert-file)")
        parser.add_argument("--no-migrate", action="store_true", help="do not apply database migrations first")
        parser.add_argument("--check", action="store_true", help="validate and print the config, then exit")
        parser.add_argument(
            "--watch-config", action="store_true",
            help="reload the config when the file or a file of --config-dir changes (checked every 2 s); "
            "SIGHUP always reloads",
        )
        parser.add_argument(
            "--drain-seconds", type=float, default=30.0,
            help="on SIGTERM/SIGINT, how long running requests may finish before models are stopped (default 30)",
        )
        parser.add_argument(
            "--client-timeout", type=float, default=60.0,
            help="seconds a client may take to send a request's headers, or stay silent while sending a body or "
            "between requests, before its connection is closed (default 60); queue waits and streams are never cut",
        )

    def handle(self, *args, **options):
        from proxy.model_processes.log_level import apply_log_level
        from proxy.model_processes.log_output import apply_log_output
        from proxy.management.config_file import read_config, serve_config_from

        from proxy.server.tls import TLSFilesError, tls_files

        if not options["config"] and not options["config_dir"]:
            raise CommandError("no config: pass --config FILE, --config-dir DIR, or both", returncode=2)
        try:
            tls = tls_files(options["tls_cert_file"], options["tls_key_file"])
        except TLSFilesError as exc:
            raise CommandError(str(exc), returncode=2) from None
        config = read_config(self, options["config"], config_dir=options["config_dir"])
        if options["check"]:
            return
        serve_config_from(options["config"], options["config_dir"])
        path, config_dir = settings.LLAMASWAP_CONFIG or None, settings.LLAMASWAP_CONFIG_DIR or None
        host, port = parse_listen(options["listen"])
        if options["client_timeout"] <= 0:
            raise CommandError(f"--client-timeout {options['client_timeout']:g}: it must be above 0 seconds")
        # Loading the application (settings.ASGI_APPLICATION) runs django.setup() again, which re-applies
        # LOGGING: logLevel goes after it.
        from channels.routing import get_default_application

        application = get_default_application()

        apply_log_level(config.log_level)
        apply_log_output(config.log_output)
        if settings.CHANNEL_LAYERS:  # a front end: the worker owns the rows, the models and the migrations
            from proxy.service import prepare_front_end

            self._require_migrated_database()
            prepare_front_end(config)
        else:
            self._hold_instance_lock()
            if not options["no_migrate"]:
                call_command("migrate", interactive=False, verbosity=0)
            from proxy.service import prepare

            prepare(config)
        self._suggest_admin_user()
        self._accept_host_names(host, bool(config.api_keys))
        self._run_daphne(
            application, host, port, options["drain_seconds"], options["client_timeout"],
            (path, config_dir) if options["watch_config"] else None, tls,
        )

    def _require_migrated_database(self) -> None:
        """A front end never migrates (several at once would race): it needs the worker to have done so."""
        from django.db import DatabaseError, connection
        from django.db.migrations.executor import MigrationExecutor

        try:
            executor = MigrationExecutor(connection)
            missing = executor.migration_plan(executor.loader.graph.leaf_nodes())
        except DatabaseError as exc:
            raise CommandError(f"cannot read the database (DATABASE_URL): {exc}") from None
        if missing:
            raise CommandError(
                f"the database (DATABASE_URL) lacks {len(missing)} of llamaswap's migrations: start `llamaswap worker` "
                "first (it migrates the database), or run `llamaswap migrate`, then start the front ends"
            )

    def _hold_instance_lock(self) -> None:
        """Before migrating or recovering: a second service on this data dir or database would undo this one's work."""
        from proxy.model_processes.instance_lock import InstanceLockError, hold_instance_lock

        try:
            hold_instance_lock()
        except InstanceLockError as exc:
            raise CommandError(str(exc)) from None

    def _accept_host_names(self, host: str, has_api_keys: bool) -> None:
        """Answer to the names this listener is reached by, and say which they are."""
        from proxy.http.hosts import ANY_HOST, ENV, is_loopback, served_hosts

        settings.ALLOWED_HOSTS = served_hosts(host, settings.ALLOWED_HOSTS)
        if ANY_HOST in settings.ALLOWED_HOSTS:
            self.stdout.write(f"Host names accepted: any ({ENV}={ANY_HOST})")
        else:
            self.stdout.write(f"Host names accepted: {', '.join(settings.ALLOWED_HOSTS)} (add others with {ENV})")
        if has_api_keys:
            return
        if not is_loopback(host):
            self.stderr.write(
                f"warning: listening on {host}, reachable from other machines, and no apiKeys are set: "
                "anyone who reaches it can use the models"
            )
        elif ANY_HOST in settings.ALLOWED_HOSTS:
            self.stderr.write(
                f"warning: {ENV}={ANY_HOST} turns off the Host check that keeps web pages (DNS rebinding) "
                "from reaching the service, and no apiKeys are set"
            )

    def _suggest_admin_user(self) -> None:
        from django.contrib.auth import get_user_model

        if not get_user_model().objects.filter(is_superuser=True).exists():
            command = shlex.quote(os.path.relpath(sys.argv[0])) if os.path.sep in sys.argv[0] else "llamaswap"
            self.stdout.write(f"No admin user yet: create one with `{command} createsuperuser`, then open /admin/.")

    def _run_daphne(
        self, application, host: str, port: int, drain_seconds: float, client_timeout: float,
        watch: tuple[str | None, str | None] | None, tls,
    ) -> None:
        from twisted.internet import reactor

        from proxy.batches import runner as batch_runner
        from proxy.batches.upload import upload_body_limit
        from proxy.server.body_limit import request_body_limit
        from proxy.server.daphne import LlamaswapServer
        from proxy.reload import reload_config, watch_config
        from proxy.service import get_service
        from proxy.server.tls import listen_endpoint

        server = LlamaswapServer(
            application,
            client_timeout=client_timeout,
            # A WebSocket message may be as large as a request body.
            message_limit=lambda: get_service().config.max_request_body_bytes,
            # A body over its limit is refused as it arrives, before Twisted has spooled it to disk.
            body_limit=lambda method, path: (upload_body_limit(get_service().config, method, path)
                                             or request_body_limit(get_service().config)),
            # A deep accept backlog: hundreds of clients may connect at once to wait in the queue.
            endpoints=[listen_endpoint(host, port, tls, backlog=2048)],
            signal_handlers=False,
            verbosity=0,
        )
        stopping: list[asyncio.Task] = []
        background: list[asyncio.Task] = []
        start_failure: list[str] = []

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
                    signal.SIGHUP,
                    lambda: asyncio.ensure_future(
                        reload_config(service, settings.LLAMASWAP_CONFIG or None, settings.LLAMASWAP_CONFIG_DIR or None)
                    ),
                )
                if watch:
                    background.append(asyncio.ensure_future(watch_config(service, *watch)))
                service.start()
                background.append(batch_runner.start(service))
            except Exception as exc:
                log.exception("llamaswap could not start")
                start_failure.append(f"{type(exc).__name__}: {exc}")
                reactor.stop()
                return
            shown = f"[{host}]" if ":" in host else host  # an IPv6 address needs brackets in a URL
            scheme = "https" if tls else "http"
            self.stdout.write(f"llamaswap serving on {scheme}://{shown}:{port} (scheduler: {service.config.scheduler.use})")
            self.stdout.flush()

        # Twisted runs `callWhenRunning` callbacks before the asyncio loop spins; call_soon waits for it.
        reactor.callWhenRunning(lambda: reactor._asyncioEventloop.call_soon(started))
        server.run()
        if server.listen_failure:
            raise CommandError(f"cannot listen on {host}:{port}: {server.listen_failure} (choose another with --listen HOST:PORT)")
        if start_failure:
            raise CommandError(f"llamaswap could not start: {start_failure[0]}")
