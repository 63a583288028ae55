"""What the serial scheduler tells of memory placement, and learns of it from the machine: the placement view,
the leases in force, the room a model would get, and what its processes are measured to use."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from . import refusals
from .effects import Effect, StartModel
from .fleet import ModelState
from .launches import Launch
from .mentions import listed
from .placement import Resident, Room, assign


class SerialMemory:
    """Part of `SerialScheduler` (its `memory` is a `MemoryBook`, or None without `hardware:`)."""

    def placement(self) -> dict | None:
        return None if self.memory is None else self.memory.view(self._in_use)

    def apply_leases(self, leases: Mapping[str, tuple[str, float]], now: float) -> list[Effect]:
        if self.memory is None:
            return []
        self.memory.set_leases(leases)
        return self.tick(now)  # a lease that ended lets its model's TTL, and requests it blocked, go

    def _start_placed(self, launch: Launch, victims: set[str], gpus: tuple[str, ...] | None, now: float) -> StartModel:
        """`launch`'s start: its victims leave the memory book and it takes `gpus`; its decision names those stopped
        for their memory (not by the groups or matrix), each with its eviction cost."""
        for_memory = tuple(sorted(victims - self._policy.evictions(launch.model, self._others(launch.model))))
        if self.memory is not None:
            for victim in victims:
                self.memory.gone(victim)
            self.memory.starting(launch.model, gpus, now)
        if for_memory:
            launch.decision = replace(launch.decision, made_room=self.memory.made_room(for_memory, gpus, now))
        return StartModel(launch.model, tuple(sorted(victims)), gpus, for_memory)

    def _gpus_for(self, model: str) -> tuple[str, ...] | None:
        """Where `model` goes once its victims (`_victims`) stop: the room they were chosen for, kept from then
        while nothing changed (None: only a protected model's stop would make room)."""
        others = self._others(model)
        room = self.memory.room(model, others, self._in_use, self._policy.evictions(model, others))
        return None if room is None or room.blocked_by else room.gpus

    def room_for(self, model: str) -> Room | None:
        if self.memory is None or model not in self._fleet:
            return None
        others = self._others(model)
        return self.memory.room_with(model, others, self._in_use, self._policy.evictions(model, others))

    def never_fits(self, model: str) -> str | None:
        """Why `model` can never start however long it waits: only stopping pinned models would make room, or it
        fits on no GPU described (None: it can, or nothing is placed by memory)."""
        if self.memory is None or model not in self._fleet:
            return None
        placed = self.memory.placed()
        pins = sorted(m for m in placed if m != model and self.memory.protection(m) == "pinned")
        if assign(self.memory.hardware, self.memory.need(model), [Resident(m, placed[m], self.memory.need(m).mib)
                                                                  for m in pins]) is not None:
            return None
        if not pins:
            return self.memory.never_fits(model) or f"model {model} needs more memory than the hardware described has"
        verb = "is" if len(pins) == 1 else "are"
        return (f"model {model} has room only if {listed((m, f'{m} (pinned)') for m in pins)} {verb} stopped, "
                "which is never done to make room")

    def can_load(self, model: str) -> dict:
        """`/api/placement/can-load`: loaded, where it runs; never fitting, why (`never_fits`); else what its start
        would stop now."""
        answer = {"fits_now": False, "loaded": False, "would_evict": [], "blocked_by": [], "gpus": [],
                  "placed_by_memory": True, "never_fits": self.memory.never_fits(model)}
        if self._fleet.state(model) is ModelState.READY and self.memory.gpus_of(model) is not None:
            return {**answer, "fits_now": True, "loaded": True, "gpus": list(self.memory.gpus_of(model))}
        room = self.room_for(model)
        if room is None:
            return answer
        return {**answer, "fits_now": not room.evict and not room.blocked_by, "would_evict": sorted(room.evict),
                "blocked_by": list(room.blocked_by), "gpus": list(room.gpus)}

    def memory_measured(self, model: str, use: Mapping[str, int]) -> str | None:
        """What `model`'s processes use on each GPU now (MiB by GPU id); a warning to log when it is more
        than the model declared, which its next placement then counts (see `MemoryBook.measured`)."""
        return None if self.memory is None else self.memory.measured(model, use)

    def _refuse_never_fitting(self, now: float) -> list[Effect]:
        """Refuse every request waiting for a model memory can never hold (its measured use grew past the hardware,
        or a reload shrank the hardware): at once, rather than left starting forever in front of other models'."""
        if self.memory is None:
            return []
        effects: list[Effect] = []
        for model in self._fleet.ids():
            launch = self._starts.of(model)
            unstarted = launch is not None and not launch.started
            if not (unstarted or self._fleet.waiting(model)) or model in self._fleet.ready_for_work():
                continue
            why = self.memory.never_fits(model)
            if why is None:
                continue
            if unstarted:
                self._starts.drop(model)
                if launch.ticket is not None:
                    effects.append(refusals.never_fits(launch.ticket.id, why))
                    self._orphan(launch)
            for ticket in self._waiting.queue.tickets_for(model):
                self._dequeue(ticket.id, now)
                effects.append(refusals.never_fits(ticket.id, why))
        return effects
