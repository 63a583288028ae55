"""The serial scheduler: each free job slot goes to the best-scoring request that can use it.

score = priority + swap affinity + waited / agingDivisor. Every model has
`slots` job slots (1 unless configured); models the swap policy lets run side by
side serve at the same time, so a request waits only behind work it competes
with: a busy model's slots, or a model that starting its own would evict.
Dispatch is non-preemptive: a swap waits for the jobs already running on the
models it evicts. Until then those models are reserved for it, so a
lower-scoring request can neither give them new work nor start a model that
would stand in the swap's way; what the swap leaves alone stays in use. A
dispatched request whose model is not loaded holds a slot of it while the model
starts, so a swap is never interrupted by another pick. With one model at a time
(no groups, or one swap group) and one slot, this is one job on the GPU at a time.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from types import MappingProxyType

from . import refusals
from .decision import Decision, ScoreTerms
from .effects import Dequeued, Effect, Grant, StartModel, StopModel
from .fleet import ModelFleet, ModelState
from .launches import Launch, Round, Slots, Starts, reserved_for
from .memory_book import MemoryBook
from .mentions import listed, named
from .placement import Hardware, Resident, Room, assign
from .priority import Band, band_of
from .settings import SerialSettings
from .snapshot import SchedulerSnapshot
from .swap import SwapPolicy
from .ticket import ModelSpec, Ticket
from .waiting import WaitingRequests


class SerialScheduler:
    name = "serial"

    def __init__(self, models: Mapping[str, ModelSpec], policy: SwapPolicy, settings: SerialSettings,
                 hardware: Hardware | None = None) -> None:
        self._fleet = ModelFleet(models)
        # With `hardware:` described, memory also decides what runs together (see `_victims`).
        self.memory = MemoryBook(hardware, models) if hardware is not None else None
        self._policy = policy
        self._settings = settings
        self._waiting = WaitingRequests(settings.aging_divisor, settings.fairness)
        self._starts = Starts()  # the model starts dispatched, and the models each one stops first
        self._slots = Slots()  # which request holds each slot of each model: jobs, and launches
        self._shut_down = False

    # -- requests -----------------------------------------------------------------------------

    def submit(self, ticket: Ticket, now: float) -> list[Effect]:
        return self.submit_all((ticket,), now)

    def submit_all(self, tickets: Iterable[Ticket], now: float) -> list[Effect]:
        """A rebuilt queue: every ticket queues before any is dispatched, so an idle GPU goes to the
        best-scoring of them, not to whichever came first. Each counts in its model's demand (its
        eviction cost) as a request submitted alone does."""
        effects: list[Effect] = []
        for ticket in tickets:
            refusal = self._refusal(ticket)
            if refusal is None:
                self._enqueue(ticket)
                if self.memory is not None:
                    self.memory.arrived(ticket.model, ticket.priority, now)
            else:
                effects.append(refusal)
        return effects + self._dispatch(now)

    def _refusal(self, ticket: Ticket) -> Effect | None:
        if self._shut_down:
            return refusals.shutting_down(ticket.id)
        if ticket.model not in self._fleet:
            return refusals.unknown_model(ticket.id, ticket.model)
        if self._holds(ticket.id):
            raise ValueError(f"ticket #{ticket.id} was already submitted; ticket ids must be unique")
        return None

    def cancel(self, ticket_id: int, now: float) -> list[Effect]:
        """The client left (or an operator cancelled): drop it wherever it is. Idempotent. What
        it reserved is free again."""
        return self.cancel_all((ticket_id,), now)

    def cancel_all(self, ticket_ids: Iterable[int], now: float) -> list[Effect]:
        """Requests that leave together (their front end is gone): each is dropped wherever it is,
        and only then is what they held given out, so none of them is granted, or has its model
        started, on the way out. One by one, a running one's slot could go to the next of them."""
        effects: list[Effect] = []
        ended_job = freed = False
        for ticket_id in ticket_ids:
            if self._dequeue(ticket_id, now) is not None:
                effects.append(Dequeued(ticket_id))
                freed = True
            elif (launch := self._launch_of(ticket_id)) is not None:
                self._orphan(launch)
                effects.append(Dequeued(ticket_id))
                if not launch.started:  # a start under way runs on: nothing is free until it ends
                    self._starts.drop(launch.model)
                    freed = True
            elif self._slots.is_running(ticket_id):
                effects += self._end_job(ticket_id, now)
                ended_job = freed = True
        return effects + (self._start_launches(now) if ended_job else []) + (self._dispatch(now) if freed else [])

    def finished(self, ticket_id: int, now: float) -> list[Effect]:
        """The granted request ended, whatever the outcome. Unknown ids are ignored."""
        if not self._slots.is_running(ticket_id):
            return []
        return self._end_job(ticket_id, now) + self._start_launches(now) + self._dispatch(now)

    def _end_job(self, ticket_id: int, now: float) -> list[Effect]:
        """A running request is over: its slot is free, given out by the caller's dispatch."""
        model = self._slots.end(ticket_id).ticket.model
        self._fleet.end_serving(model, now)
        return self._stop_if_retired(model)

    def _launch_of(self, ticket_id: int) -> Launch | None:
        return self._starts.for_ticket(ticket_id)

    def reprioritize(self, ticket_id: int, priority: int, now: float) -> list[Effect]:
        """Re-rank a waiting request; it keeps its arrival time, so its aging carries on. The
        new rank may let it, or others, go now."""
        if self._waiting.reprioritize(ticket_id, priority) is None:
            return []
        return self._dispatch(now)

    # -- models -------------------------------------------------------------------------------

    def model_ready(self, model: str, now: float) -> list[Effect]:
        released = self._release_evicted(model)
        if self._fleet.state(model) is not ModelState.STARTING:
            return self._start_launches(now) + self._dispatch(now) if released else []  # unloaded or shut down meanwhile
        self._fleet.mark_ready(model, now)
        if self.memory is not None:
            self.memory.ready(model, now)
        launch = self._starts.take(model)
        effects: list[Effect] = []
        if launch.ticket is None:  # its client left during the start, or a reload replaces the model
            effects += self._stop_if_retired(model)
        else:
            self._slots.free(model, launch.slot)
            effects.append(self._grant(launch.ticket, launch.decision, launch.slot))
        return effects + (self._start_launches(now) if released else []) + self._dispatch(now)

    def model_failed(self, model: str, reason: str, now: float) -> list[Effect]:
        """The start failed: its request and every request waiting for the same model would hit
        the same failure, so all of them get it now."""
        released = self._release_evicted(model)
        if self._fleet.state(model) is not ModelState.STARTING:
            return self._start_launches(now) + self._dispatch(now) if released else []
        replaced_config = self._fleet.is_retiring(model)
        self._mark_stopped(model)
        launch = self._starts.take(model)
        effects: list[Effect] = []
        if launch.ticket is not None:
            self._slots.free(model, launch.slot)
            effects.append(refusals.start_failed(launch.ticket.id, model, reason))
        if not replaced_config:  # a start with the reloaded config may well succeed: let them try
            for ticket in self._waiting.queue.tickets_for(model):
                self._dequeue(ticket.id, now)
                effects.append(refusals.start_failed(ticket.id, model, reason))
        return effects + self._start_launches(now) + self._dispatch(now)

    def model_stopped(self, model: str, now: float) -> list[Effect]:
        """A stop finished, or a ready model exited on its own (its requests fail by themselves and
        the runtime then calls `finished` for each). A start reports through ready/failed instead."""
        if self._fleet.state(model) in (ModelState.STOPPED, ModelState.STARTING):
            return []
        self._mark_stopped(model)
        return self._start_launches(now) + self._dispatch(now)

    def unload(self, models: Iterable[str] | None, now: float) -> list[Effect]:
        """Stop the given models (None: every running or starting one). A request whose model
        was starting is told so; those it was serving are cut by the runtime when it carries out
        the stop (and reported `finished`); waiting requests stay queued and will start it again."""
        active = (ModelState.READY, ModelState.STARTING)
        targets = (
            self._fleet.in_state(*active)
            if models is None
            else sorted({m for m in models if m in self._fleet and self._fleet.state(m) in active})
        )
        effects: list[Effect] = []
        for model in targets:
            effects.append(self._stop(model, "unload"))
            launch = self._starts.of(model)
            if launch is not None and launch.started:
                self._starts.drop(model)
                if launch.ticket is not None:
                    effects.append(refusals.unloaded(launch.ticket.id, model))
                    self._orphan(launch)
        return effects + self._dispatch(now)

    def tick(self, now: float) -> list[Effect]:
        """Unload models idle for longer than their TTL; with hardware described, a model's minResidency
        may have ended, letting a request it blocked go."""
        if self.memory is None:
            return [self._stop(model, "ttl") for model in self._fleet.ttl_expired(now)]
        self.memory.advance(now)
        stops: list[Effect] = [self._stop(m, "ttl") for m in self._fleet.ttl_expired(now) if not self.memory.leased(m)]
        return stops + self._start_launches(now) + self._dispatch(now)

    def next_deadline(self) -> float | None:
        if self.memory is None:
            return self._fleet.next_ttl_deadline()
        deadlines = [self._fleet.next_ttl_deadline(self.memory.leased), self.memory.next_deadline()]
        return min((d for d in deadlines if d is not None), default=None)

    # -- operations ---------------------------------------------------------------------------

    def retune(self, settings: SerialSettings, now: float) -> list[Effect]:
        """Adopt edited settings; they apply from the next pick. A model given fewer slots than
        it has jobs keeps them until they end, and takes no new ones until below its slots."""
        self._waiting.retune(settings)
        self._settings = settings
        return self._dispatch(now)

    def shutdown(self, now: float) -> list[Effect]:
        """Refuse everything still waiting and stop every model; running requests are left to
        the runtime's drain."""
        if self._shut_down:
            return []
        self._shut_down = True
        effects: list[Effect] = []
        for launch in self._starts:
            if launch.ticket is not None:
                effects.append(refusals.shutting_down(launch.ticket.id))
                self._orphan(launch)
        self._starts.clear()
        for ticket in self._waiting.remove_all():
            self._fleet.end_waiting(ticket.model, now)
            effects.append(refusals.shutting_down(ticket.id))
        effects += [
            self._stop(model, "shutdown") for model in self._fleet.in_state(ModelState.READY, ModelState.STARTING)
        ]
        return effects

    def snapshot(self, now: float) -> SchedulerSnapshot:
        oldest = self._waiting.queue.band_oldest_arrival()
        return SchedulerSnapshot(
            depth_by_band=MappingProxyType(self._waiting.queue.band_depths()),
            oldest_wait_by_band=MappingProxyType(
                {band: 0.0 if oldest[band] is None else max(0.0, now - oldest[band]) for band in Band}
            ),
            running_tickets=self._slots.running(),
            loaded=self._fleet.loaded(),
            starting=self._fleet.in_state(ModelState.STARTING),
            waiting=len(self._waiting.queue),
            settings=self._settings,
            running=MappingProxyType(self._slots.by_model()),
            slots=MappingProxyType({model: self._settings.slots_for(model) for model in self._fleet.ids()}),
        )

    def is_queued(self, ticket_id: int) -> bool:
        return ticket_id in self._waiting.queue

    def held_back_because(self, ticket_id: int) -> str:
        return self._waiting.held_back_because(ticket_id)

    def ranked(self, now: float) -> list[tuple[Ticket, ScoreTerms]]:
        """Waiting requests best first, with the score each would get right now."""
        return self._waiting.queue.ranked(now, self._fleet.ready_for_work(), self._settings)

    # -- a reloaded config: models removed or replaced, new swap rules, new hardware ----------------


    def reconfigure(
        self, models: Mapping[str, ModelSpec], policy: SwapPolicy, restart: Iterable[str], now: float,
        hardware: Hardware | None = None,
    ) -> list[Effect]:
        """Adopt a reloaded config: new model table and swap groups from now on.

        Requests for removed models are refused; requests for restarted models (whose command
        changed, or that run on a GPU the new hardware lacks) keep waiting and start them again
        once the old process has stopped. Either
        kind of model stops at once when idle, else when its requests or start end. Ids in
        `restart` that `models` lacks are ignored. Effects come in model id order.
        """
        if self._shut_down:
            return []
        removed = self._fleet.reconfigure(models)
        self._policy = policy
        if hardware is None:
            self.memory = None
        else:
            self.memory = self.memory or MemoryBook(hardware, models)
            # A crashed model holds no memory; nor does one a start under way stops (that start took its memory).
            holding = [m for m in self._fleet.not_stopped() if self._starts.stopped_for(m) is None]
            self.memory.reconfigure(models, hardware, holding)
            restart = {*restart, *self.memory.on_retiring()}
        replaced = sorted(set(removed) | (set(restart) & models.keys()))
        effects: list[Effect] = []
        for model in replaced:
            effects += self._remove(model, now) if model in removed else self._restart(model)
        return effects + self._start_launches(now) + self._dispatch(now)

    def _remove(self, model: str, now: float) -> list[Effect]:
        """A model the reload dropped: refuse whoever waits for it, and stop it once idle. A start
        under way is cut short, since nobody is left to use it."""
        effects: list[Effect] = []
        launch = self._starts.drop(model)
        if launch is not None and launch.ticket is not None:
            effects.append(refusals.removed(launch.ticket.id, model))
            self._orphan(launch)
        for ticket in self._waiting.queue.tickets_for(model):
            self._dequeue(ticket.id, now)
            effects.append(refusals.removed(ticket.id, model))
        if self._fleet.state(model) is ModelState.STARTING or self._fleet.retire(model):
            effects.append(self._stop(model, "reload"))
        return effects

    def _restart(self, model: str) -> list[Effect]:
        """A model whose process the reload replaces. A start under way still runs on the old
        config, so the request it was for waits again, for a start with the new one."""
        launch = self._starts.of(model)
        if launch is not None and launch.started and launch.ticket is not None:
            ticket = launch.ticket
            self._orphan(launch)
            self._enqueue(ticket)
        return [self._stop(model, "reload")] if self._fleet.retire(model) else []

    # -- memory placement: the view, the leases in force, the room a model would get, measured use ---------


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

    # -- dispatch -----------------------------------------------------------------------------

    def _dispatch(self, now: float) -> list[Effect]:
        """Give free slots to the best requests that can use them, until none can."""
        if self._shut_down:
            return []
        effects = self._refuse_never_fitting(now)
        while self._dispatch_walk(now, effects):
            pass
        return effects

    def _dispatch_walk(self, now: float, effects: list[Effect]) -> bool:
        """Walk the models' best waiting requests, best first, dispatching each that can go:
        granted on a ready model with a free slot, or given a launch of its model. Requests that
        cannot go set aside what they need from the ones below them. A grant frees nothing, so
        what was held back stays held back and the walk goes on, with the granted model's next
        request in its place; a launch may stop models, so it ends the walk. Returns whether
        to walk again."""
        loaded = self._fleet.ready_for_work()
        tops = self._waiting.queue.model_tops(loaded, self._settings)
        if not tops:
            return False
        round_ = Round()
        up = self._holding()
        for launch in self._starts:
            if not launch.started:  # its evictions are promised; keep them idle until it starts
                round_.reserve(self._decision_id(launch), launch.model, self._victims(launch.model, up))
        partly_idle: bool | None = None  # worked out when first needed, again after each grant
        held_back = False
        while tops:
            _, ticket = tops.pop(0)
            reason = self._holdback(ticket, loaded, up, round_)
            if reason is not None:
                held_back = True
                if partly_idle is None:
                    partly_idle = self._partly_idle(loaded)
                if partly_idle:
                    self._waiting.hold_back(ticket.id, reason)
                continue
            effects += self._dispatch_ticket(ticket, now, loaded, best_overall=not held_back)
            if ticket.model not in loaded:
                return True
            following = self._waiting.queue.model_top(ticket.model, loaded, self._settings)
            if following is not None:
                index = next((i for i, (rank, _) in enumerate(tops) if rank < following[0]), len(tops))
                tops.insert(index, following)
            partly_idle = None
        return False

    def _partly_idle(self, loaded: tuple[str, ...]) -> bool:
        """Whether a loaded model has a free slot: then a request held back is told why."""
        return any(self._slots.used(m) < self._settings.slots_for(m) for m in loaded)

    def _holdback(self, ticket: Ticket, loaded: tuple[str, ...], up: tuple[str, ...], round_: Round) -> str | None:
        """Why `ticket` cannot be dispatched now (None: it can). Reserves what it needs when
        only busy work stands in its way."""
        model = ticket.model
        reserved = round_.reserved.get(model)
        if reserved is not None:
            return reserved_for(*reserved)
        if model in loaded:
            used, slots = self._slots.used(model), self._settings.slots_for(model)
            return None if used < slots else f"model {model} was busy ({used}/{slots} slots)"
        if model in self._starts or self._fleet.state(model) is ModelState.STARTING:
            return f"model {model} was starting"
        evicting = self._evicted_by_start(model)
        if evicting is not None:  # it goes once that start has ended (or was given up): nothing below may get in first
            round_.reserve(ticket.id, model, self._victims(model, up) | {model})
            return f"model {model} was being stopped for the start of {named(evicting)}"
        for target, ticket_id in round_.targets:
            if not self._may_start_beside(model, target, up):
                return reserved_for(ticket_id, target)
        others = self._others(model)
        if self.memory is not None and (
            blocked := self.memory.blocked(model, others, self._in_use, self._policy.evictions(model, others))
        ):
            return blocked
        victims = self._victims(model, up)
        busy = sorted(v for v in victims | {model} if self._in_use(v))
        if busy:  # wait for them to finish; meanwhile nothing below may add to their work
            round_.reserve(ticket.id, model, victims | {model})
            return f"{named(busy[0], f'model {busy[0]}')} was busy, and starting {model} stops it"
        return None

    def _dispatch_ticket(self, ticket: Ticket, now: float, loaded: tuple[str, ...], best_overall: bool) -> list[Effect]:
        """Grant `ticket` a slot of its ready model, or launch its model for it. The decision
        compares it with the whole queue when it is the best request overall, else with the
        requests for its model: those are what it beat to the slot. Fair share may send another in its place."""
        if best_overall:
            pick = self._waiting.queue.pick(now, loaded, self._settings)
        else:
            pick = self._waiting.queue.pick_within(ticket.model, now, loaded, self._settings)
        assert pick is not None and pick.ticket.id == ticket.id
        ticket, head = self._waiting.take_turn(ticket), ticket
        waited_because = self._waiting.held_back_because(ticket.id)
        self._dequeue(ticket.id, now)
        ready = ticket.model in loaded
        slot = self._slots.take(ticket.model, ticket.id)
        decision = Decision(
            ticket_id=ticket.id,
            model=ticket.model,
            scheduler=self.name,
            priority=ticket.priority,
            band=band_of(ticket.priority),
            score=pick.score,
            terms=pick.terms,
            queue_wait_s=now - ticket.arrival,
            runner_up_id=None if pick.runner_up is None else pick.runner_up.id,
            runner_up_score=pick.runner_up_score,
            changed_by_aging=pick.changed_by_aging,
            changed_by_affinity=pick.changed_by_affinity,
            needs_swap=not ready,
            fifo_priority=None,
            slot=slot,
            waited_because=waited_because,
        )
        if ticket is not head:
            decision = self._waiting.turn_decision(decision, ticket, head, pick, now, loaded, self._settings)
        if ready:
            self._slots.free(ticket.model, slot)
            return [self._grant(ticket, decision, slot)]
        self._starts.add(Launch(ticket.model, decision, ticket, slot))
        return self._start_launches(now)

    def _start_launches(self, now: float) -> list[Effect]:
        """Send each pending StartModel once no model it depends on is still stopping or busy,
        and no model removed by a reload is still up."""
        effects = self._refuse_never_fitting(now)
        for launch in self._starts:
            if launch.started:
                continue
            victims = self._victims(launch.model, self._holding())
            stopping = ModelState.STOPPING
            if self._fleet.state(launch.model) is stopping or any(self._fleet.state(v) is stopping for v in victims):
                continue  # model_stopped resumes the launch
            if any(self._in_use(v) for v in victims) or self._fleet.departing() or self._removed_still_serving():
                continue  # so does the end of that work, or the stop or last job of the last removed model
            if self._evicted_by_start(launch.model) is not None:
                continue  # and the end of the start that stops it
            gpus = None
            if self.memory is not None:
                gpus = self._gpus_for(launch.model)
                if gpus is None:
                    continue  # only stopping a pinned or leased model makes room: it waits for that to change
            for victim in victims:
                self._fleet.mark_stopping(victim)
            self._fleet.mark_starting(launch.model)
            self._starts.sent(launch, victims)
            effects.append(self._start_placed(launch, victims, gpus, now))
        return effects

    def _evicted_by_start(self, model: str) -> str | None:
        """The model whose start under way stops `model` first: `model` may not start again
        until that start has ended, or the two would race for its process."""
        return self._starts.stopped_for(model)

    def _release_evicted(self, model: str) -> bool:
        """`model`'s start has ended: what it stopped first is gone. Returns whether it stopped any."""
        victims = self._starts.release(model)
        for victim in victims:
            if self._fleet.state(victim) is ModelState.STOPPING:
                self._fleet.mark_stopped(victim)
        return bool(victims)

    def _holding(self) -> tuple[str, ...]:
        """Configured models holding the GPU: up, or still running jobs on a process that exited
        (until the runtime reports those ended)."""
        busy = (m for m in self._slots.models() if m in self._fleet)
        return tuple(sorted({*self._fleet.not_stopped(), *busy}))

    def _removed_still_serving(self) -> bool:
        """Jobs still run on a model a reload removed (its process may have exited already): the
        config no longer says what may share the GPU with it, so nothing starts until they end."""
        return any(model not in self._fleet for model in self._slots.models())

    def _victims(self, model: str, holding: tuple[str, ...]) -> frozenset[str]:
        """What of `holding` (see `_holding`) must stop before `model` starts. `model` itself is
        left out even when a slot is already taken for its launch: the matrix evicts nothing for a
        running target. With hardware described, also the least-cost set whose memory it needs."""
        others = tuple(m for m in holding if m != model)
        victims = self._policy.evictions(model, others)
        room = self.memory.room(model, others, self._in_use, victims) if self.memory is not None else None
        return victims | room.evict if room is not None else victims

    def _others(self, model: str) -> tuple[str, ...]:
        return tuple(m for m in self._holding() if m != model)

    def _in_use(self, model: str) -> bool:
        """Serving, starting, or holding a slot for a launch: not to be evicted."""
        return self._slots.used(model) > 0 or self._fleet.serving(model) > 0 or (
            self._fleet.state(model) is ModelState.STARTING
        )

    def _may_start_beside(self, model: str, target: str, up: tuple[str, ...]) -> bool:
        """Whether starting `model` now leaves the reserved swap to `target` no more to evict (with
        hardware described: nor less room for it)."""
        before = self._policy.evictions(target, up)
        leaving = self._policy.evictions(model, up)
        after_start = (set(up) - leaving) | {model}
        if not self._policy.evictions(target, after_start) <= before:
            return False
        return self.memory is None or self.memory.leaves_room(model, leaving, target, before, up, self._in_use)

    @staticmethod
    def _decision_id(launch: Launch) -> int:
        return launch.decision.ticket_id

    # -- internals ----------------------------------------------------------------------------

    def _holds(self, ticket_id: int) -> bool:
        return ticket_id in self._waiting.queue or self._slots.is_running(ticket_id) or self._launch_of(ticket_id) is not None

    def _orphan(self, launch: Launch) -> None:
        """The launch's request is gone (left, refused or sent back to the queue)."""
        self._slots.free(launch.model, launch.slot)
        launch.ticket = None

    def _enqueue(self, ticket: Ticket) -> None:
        self._waiting.add(ticket)
        self._fleet.begin_waiting(ticket.model)

    def _dequeue(self, ticket_id: int, now: float) -> Ticket | None:
        ticket = self._waiting.remove(ticket_id)
        if ticket is not None:
            self._fleet.end_waiting(ticket.model, now)
        return ticket

    def _grant(self, ticket: Ticket, decision: Decision, slot: int) -> Grant:
        self._slots.grant(ticket, slot)
        self._fleet.begin_serving(ticket.model)
        return Grant(ticket.id, ticket.model, decision)

    def _stop_if_retired(self, model: str) -> list[Effect]:
        """Stop a model a reload retired, now that its last request or its start has ended."""
        return [self._stop(model, "reload")] if self._fleet.due_for_retirement(model) else []

    def _mark_stopped(self, model: str) -> None:
        self._fleet.mark_stopped(model)
        if self.memory is not None:
            self.memory.gone(model)

    def _stop(self, model: str, reason: str) -> StopModel:
        self._fleet.mark_stopping(model)
        return StopModel(model, reason)

