"""Model leases kept where the scheduler runs: the lease rows in force handed to the scheduler, each leased model
loaded again whenever it is not loaded or loading and has room, and what each lease is doing now (its `state`).

Rows are read every `SYNC_S`, and at once when a front end asks (`scheduling.door.questions.KeepLeases`: a lease
made, revoked or shown). One read is handed over at a time, so an older read never undoes a newer one.

A leased model lost (stopped by a failure, killed, its start refused) is loaded again, but not in a tight loop:
the nth load in a row waits `retry_after(n)` after the one before ended (1 s, 2 s, 4 s … at most `RETRY_MAX_S`);
the count starts over once the model has stayed loaded for `STEADY_S`."""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime, timezone

from django.db import DatabaseError

from scheduling.core.mentions import named, plain
from scheduling.outage_log import OutageLog
from scheduling.rows.connections import on_fresh_connection
from scheduling.rows.leases import SYNC_S, leases_in_force, revoke_leases_of
from scheduling.tickets import Outcome, Refused, RequestState, TicketRequest

log = logging.getLogger("llamaswap.leases")

RETRY_MAX_S = 60.0
STEADY_S = 60.0


def retry_after(loads: int) -> float:
    """How long after the end of the `loads`th load in a row of a leased model the next one may begin."""
    return 0.0 if loads < 1 else min(RETRY_MAX_S, 2.0 ** (loads - 1))


class ModelLeases:
    """`runtime.model_leases`: the one way lease rows reach the scheduler."""

    def __init__(self, runtime) -> None:
        self._runtime = runtime
        self._lock = asyncio.Lock()
        self._rows: list[tuple[int, str, datetime]] | None = None  # the last read handed over
        self._outage = OutageLog(log, "reading the model leases (the last read stands)")
        self._loading: dict[str, asyncio.Task] = {}  # a leased model's load under way
        self._loads: dict[str, int] = {}  # loads in a row of each leased model
        self._retry_at: dict[str, float] = {}  # when the next load of a leased model may begin
        self._failure: dict[str, str] = {}  # why its last load failed
        self._loaded_since: dict[str, float] = {}

    async def run(self) -> None:
        """Read the rows every `SYNC_S` (the database away: the last read stands)."""
        while True:
            await self.refresh()
            await asyncio.sleep(SYNC_S)

    async def refresh(self) -> None:
        """Read the rows now, hand them to the scheduler where they changed, and load leased models not loaded."""
        async with self._lock:
            try:
                rows = await asyncio.get_running_loop().run_in_executor(None, on_fresh_connection, leases_in_force)
                self._outage.worked()
            except DatabaseError as exc:
                self._outage.failed(exc)
            else:
                self._hand_over(rows)
            self._keep_loaded()

    async def revoke_for(self, models: tuple[str, ...] | None) -> None:
        """An operator unloads `models` (None: all): the operator wins, their leases end first (else they would
        load them again)."""
        async with self._lock:
            if not any(models is None or model in models for _, model, _ in self._rows or []):
                return  # none read within `SYNC_S`
            revoked = await asyncio.get_running_loop().run_in_executor(None, on_fresh_connection, revoke_leases_of,
                                                                       models)
            for lease_id, model in revoked:
                log.info("lease #%d on model %s revoked: an operator unloaded the model", lease_id, model)
            if revoked and self._rows is not None:
                gone = {lease_id for lease_id, _ in revoked}
                self._hand_over([row for row in self._rows if row[0] not in gone])

    def _hand_over(self, rows: list[tuple[int, str, datetime]]) -> None:
        if rows == self._rows:
            return
        now, before = datetime.now(timezone.utc), self._rows or []
        for lease_id, model, expires_at in before:
            if lease_id not in {row[0] for row in rows}:
                log.info("lease #%d on model %s ended (%s)", lease_id, model,
                         "expired" if expires_at <= now else "revoked")
        for lease_id, model, _ in rows:
            if lease_id not in {row[0] for row in before}:
                log.info("lease #%d keeps model %s loaded", lease_id, model)
        self._rows = rows
        self._runtime.operators.apply_leases(rows)

    def _leased(self) -> set[str]:
        return {model for _, model, _ in self._rows or []}

    def _keep_loaded(self) -> None:
        """Load each leased model that is not loaded or loading, once it has room that stops no busy, pinned or
        leased model, and its retry is due; give up loads for models no longer leased."""
        leased, now = self._leased(), self._runtime.now()
        for model, task in list(self._loading.items()):
            if model not in leased:
                task.cancel()
        snapshot = self._runtime.snapshot[1]
        for model in self._oldest_lease_first(leased & set(self._configured())):
            if model in snapshot.loaded:
                since = self._loaded_since.setdefault(model, now)
                if now - since >= STEADY_S:
                    self._loads.pop(model, None)
                continue
            self._loaded_since.pop(model, None)
            if model in snapshot.starting or model in self._loading or now < self._retry_at.get(model, 0.0):
                continue
            if self._held_back(model) is None:
                self._loading[model] = asyncio.get_running_loop().create_task(self._load(model))

    def _oldest_lease_first(self, models: set[str]) -> list[str]:
        """`models` by their oldest lease: where not all fit, those leased first are loaded first, so a restart or a
        takeover keeps the models that were loaded before it, not those first by name."""
        first: dict[str, int] = {}
        for lease_id, model, _ in self._rows or []:
            first[model] = min(lease_id, first.get(model, lease_id))
        return sorted(models, key=lambda model: (first[model], model))

    async def _load(self, model: str) -> None:
        self._loads[model] = self._loads.get(model, 0) + 1
        try:
            grant = await self._runtime.submit(TicketRequest(model=model, path="(lease)", priority=0, method="LOAD"))
        except Refused as exc:
            if exc.code == "shutting_down":
                return  # nothing to try again, nor to warn of
            self._failure[model] = exc.message
            log.warning("loading leased model %s failed (%s); trying again in %.0f s", model, plain(exc.message),
                        retry_after(self._loads[model]))
        else:
            self._failure.pop(model, None)
            self._runtime.release(grant.ticket_id, Outcome(state=RequestState.COMPLETED, status_code=200))
        finally:
            self._loading.pop(model, None)
            self._retry_at[model] = self._runtime.now() + retry_after(self._loads.get(model, 0))

    def _configured(self) -> list[str]:
        return list(self._runtime.fleet.config.models)

    def _held_back(self, model: str) -> dict | None:
        """Why a leased model not loaded cannot be loaded now: a state (`waiting` or `cannot_fit`), or None."""
        placement = self._runtime.scheduler.placement()
        if placement is None:
            return None  # nothing placed by memory: the queue decides
        never = self._runtime.scheduler.never_fits(model)
        room = self._runtime.scheduler.room_for(model)
        if never is not None or room is None:
            return {"state": "cannot_fit", "why": never or f"model {model} fits on no GPU described"}
        if room.blocked_by:  # the pins leave room (it would never fit else): what waits on is the others' protection
            protected = {m: facts["protected"] for m, facts in placement["models"].items()
                         if facts["protected"] and facts["protected"] != "pinned" and m != model}
            blocking = [m for m in room.blocked_by if m in protected] or sorted(protected)
            return {"state": "waiting", "blocked_by": [named(m, f"{m} ({protected[m]})") for m in blocking]}
        snapshot = self._runtime.snapshot[1]
        busy = sorted(m for m in room.evict if m in snapshot.running or m in snapshot.starting)
        if busy:
            return {"state": "waiting", "blocked_by": [named(m, f"{m} (busy)") for m in busy]}
        return None

    def states(self) -> dict[int, dict]:
        """Each lease in force on a model served here: `loaded`, `loading`, `waiting` (with `blocked_by`, or a
        retry after a loss) or `cannot_fit` (with `why`)."""
        snapshot, now, configured = self._runtime.snapshot[1], self._runtime.now(), set(self._configured())
        shown = {}
        for lease_id, model, _ in self._rows or []:
            if model not in configured:
                continue  # another worker's, or removed by a reload (the front end says which)
            if model in snapshot.loaded:
                shown[lease_id] = {"state": "loaded"}
            elif model in snapshot.starting:
                shown[lease_id] = {"state": "loading"}
            elif (held := self._held_back(model)) is not None:
                shown[lease_id] = held
            elif model in self._loading:
                shown[lease_id] = {"state": "loading"}
            elif now < self._retry_at.get(model, 0.0):
                failure = {"last_error": self._failure[model]} if model in self._failure else {}
                shown[lease_id] = {"state": "waiting", "retry_in_s": round(self._retry_at[model] - now, 1), **failure}
            else:
                shown[lease_id] = {"state": "waiting", "blocked_by": []}
        return shown
