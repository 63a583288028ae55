"""What operators do to the engine: cancel, cut or re-rank requests, refuse a key's waiting ones, retune and
reconfigure the core, hand it the model leases in force; and how another thread (a sync admin view, a scrape)
reaches the engine's event loop."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any, Callable

from scheduling.core import ModelSpec, SerialSettings, SwapPolicy, band_of
from scheduling.core.placement import Hardware
from scheduling.tickets import Refused, RequestState


class OperatorActions:
    """`runtime.operators`: the operators' ways into the engine. It owns no state of its own.

    Reads: the engine's held requests (`runtime.held`), its core's queue (`runtime.scheduler.is_queued`), its
    clock and event loop. Changes: requests only through the engine's request path (a running one cut with
    `runtime._cut`, a waiting one refused with `runtime._refuse_waiting`), the core only through `runtime._run`,
    and a re-ranked request's row (its priority and band) through `runtime.recorder`."""

    def __init__(self, runtime) -> None:
        self._runtime = runtime

    def cut(self, ticket_id: int) -> bool:
        """End a running request now, its client told why. Returns whether it ran."""
        runtime = self._runtime
        if ticket_id not in runtime.held.granted:
            return False
        runtime._cut([ticket_id], Refused(503, "cancelled_by_operator", "cancelled by an operator while running"))
        return True

    def cancel(self, ticket_id: int) -> bool:
        """Fail a queued request with a clear message. Returns whether it was waiting."""
        runtime = self._runtime
        if ticket_id not in runtime.held.waiting:
            return False
        reason = Refused(503, "cancelled_by_operator", f"cancelled by an operator {runtime._where(ticket_id)}")
        runtime._refuse_waiting(ticket_id, reason, RequestState.CANCELLED)
        return True

    def refuse_key(self, key: str, reason: Refused) -> list[int]:
        """Refuse every waiting request of the API key `key` with `reason` (the key no longer counts); returns
        their ids. Its running requests go on."""
        runtime = self._runtime
        refused = [ticket_id for ticket_id, waiter in runtime.held.waiting.items() if key and waiter.request.api_key == key]
        for ticket_id in refused:
            runtime._refuse_waiting(ticket_id, reason, RequestState.CANCELLED)
        return refused

    def reprioritize(self, ticket_id: int, priority: int) -> bool:
        """Re-rank a queued request. Returns whether it was still queued (one whose model is starting for it
        has left the queue)."""
        runtime = self._runtime
        if ticket_id not in runtime.held.waiting or not runtime.scheduler.is_queued(ticket_id):
            return False
        now = runtime.now()
        runtime._run(lambda: runtime.scheduler.reprioritize(ticket_id, priority, now))
        runtime.recorder.update(ticket_id, priority=priority, band=band_of(priority).value)
        return True

    def retune(self, settings: SerialSettings) -> None:
        runtime = self._runtime
        now = runtime.now()
        runtime._run(lambda: runtime.scheduler.retune(settings, now))

    def reconfigure(self, models: Mapping[str, ModelSpec], policy: SwapPolicy, restart: list[str],
                    hardware: Hardware | None = None) -> None:
        """A reloaded config: new model table, swap groups and hardware; `restart` models get a fresh process."""
        runtime = self._runtime
        now = runtime.now()
        runtime._run(lambda: runtime.scheduler.reconfigure(models, policy, restart, now, hardware))

    def apply_leases(self, leases: list[tuple[int, str, datetime]]) -> None:
        """The model leases in force, as rows say them (id, model, when it expires): each model is kept loaded
        until its latest one expires."""
        runtime = self._runtime
        now, wall = runtime.now(), datetime.now(timezone.utc)
        kept: dict[str, tuple[str, float]] = {}
        for lease_id, model, expires_at in sorted(leases, key=lambda lease: lease[2]):
            kept[model] = (f"lease #{lease_id}", now + (expires_at - wall).total_seconds())
        runtime._run(lambda: runtime.scheduler.apply_leases(kept, now))

    def from_thread(self, fn: Callable[..., Any], *args: Any, timeout: float = 5.0) -> Any:
        """Run `fn(*args)` on the engine's event loop from another thread (sync admin views, a scrape) and
        return its result, awaited there when it is awaitable."""

        async def call():
            result = fn(*args)
            return await result if inspect.isawaitable(result) else result

        coroutine = call()
        try:
            future = asyncio.run_coroutine_threadsafe(coroutine, self._runtime._loop)
        except RuntimeError:  # the loop has closed (a process shutting down): the call is never run
            coroutine.close()
            raise
        return future.result(timeout)
