"""A stand-in for the runtime in property tests: carries out effects, remembers what it owes the
scheduler (start and stop outcomes), and checks that every request ends exactly once."""

from scheduling.core import Dequeued, Effect, Grant, Refuse, StartModel, StopModel, Ticket


class RuntimeDouble:
    def __init__(self, scheduler) -> None:
        self.scheduler = scheduler
        self.now = 0.0
        self.tickets: dict[int, Ticket] = {}
        self.ended: dict[int, str] = {}  # id -> finished | rejected | cancelled
        self.granted: set[int] = set()
        self.running: dict[int, str] = {}  # granted and not yet finished -> model
        self.cancel_requested: set[int] = set()
        self.starts: dict[str, frozenset[str]] = {}  # start under way -> the models it evicts
        # Starts cut short by a stop, with what they evicted: they report failure before the stop ends.
        self.aborted_starts: dict[str, frozenset[str]] = {}
        self.stops: set[str] = set()
        self.up: set[str] = set()  # models whose process is running (started and not yet stopped)
        self.superseded: set[str] = set()  # models a reload replaced or removed, not started since
        self.configured: set[str] | None = None  # the latest reload's models; None before any reload
        self.next_id = 1

    # -- what the effects and events say ------------------------------------------------------

    def ready_for_work(self) -> set[str]:
        """Models that are up by the double's own account (a start reported ready, no stop or
        crash since), not being stopped and not replaced by a reload: those earn swap affinity."""
        return self.up - self.stops - self.superseded

    def waiting(self) -> set[int]:
        """Requests neither granted nor ended: work the GPU owes."""
        return self.tickets.keys() - self.granted - self.ended.keys()

    # -- calls into the scheduler -------------------------------------------------------------

    def call(self, method: str, *args, **keywords) -> list[Effect]:
        effects = getattr(self.scheduler, method)(*args, self.now, **keywords)
        for effect in effects:
            self.apply(effect)
        idle = (self.superseded & self.up) - set(self.running.values()) - self.stops
        assert not idle, f"{sorted(idle)}: replaced by a reload and idle, but not being stopped"
        return effects

    def new_ticket(self, model: str, priority: int) -> Ticket:
        ticket = Ticket(self.next_id, model, priority, self.now)
        self.next_id += 1
        self.tickets[ticket.id] = ticket
        return ticket

    def finish(self, ticket_id: int) -> list[Effect]:
        if ticket_id in self.running:
            del self.running[ticket_id]
            self.ended[ticket_id] = "finished"
        return self.call("finished", ticket_id)

    def cancel(self, ticket_id: int) -> list[Effect]:
        self.cancel_requested.add(ticket_id)
        if ticket_id in self.running:  # a running request that is cancelled ends like a finished one
            del self.running[ticket_id]
            self.ended[ticket_id] = "finished"
        return self.call("cancel", ticket_id)

    def reconfigure(self, models, policy, restart, hardware=None) -> list[Effect]:
        """Reload: from now on, no process started before this may serve the changed models, nor those on a GPU
        the new `hardware` lacks."""
        dropped = set(self.scheduler.snapshot(self.now).loaded) | set(self.starts) | self.stops
        memory = getattr(self.scheduler, "memory", None)
        moved = set() if hardware is None or memory is None else {
            model for model, gpus in memory.placed().items() if set(gpus) - set(hardware.gpus)}
        self.superseded |= (dropped - set(models)) | set(restart) | (moved & set(models))
        self.configured = set(models)
        return self.call("reconfigure", models, policy, restart, **({} if hardware is None else {"hardware": hardware}))

    def answer_start(self, model: str, ok: bool) -> list[Effect]:
        del self.starts[model]
        if ok:
            self.up.add(model)
            return self.call("model_ready", model)
        return self.call("model_failed", model, "exited prematurely")

    def answer_stop(self, model: str) -> list[Effect]:
        if model in self.aborted_starts:  # the aborted start reports before the stop completes
            del self.aborted_starts[model]
            aborted = self.call("model_failed", model, "aborted")  # may start what waited for its evictions
            assert not [e for e in aborted if isinstance(e, (Grant, Refuse))], f"an aborted start answered {aborted}"
        self.stops.discard(model)
        self.up.discard(model)
        return self.call("model_stopped", model)

    def crash(self, model: str) -> list[Effect]:
        self.up.discard(model)
        return self.call("model_stopped", model)

    def settle(self) -> None:
        """Answer everything owed and finish every request until nothing is left to do."""
        for _ in range(10_000):
            if self.stops:
                self.answer_stop(min(self.stops))
            elif self.starts:
                self.answer_start(min(self.starts), ok=True)
            elif self.running:
                self.finish(min(self.running))
            else:
                break
        else:
            raise AssertionError("the scheduler never settled")

    # -- effects ------------------------------------------------------------------------------

    def apply(self, effect: Effect) -> None:
        if isinstance(effect, Grant):
            self._granted(effect)
        elif isinstance(effect, Refuse):
            assert effect.ticket_id not in self.granted, f"#{effect.ticket_id} rejected after its grant"
            self._end(effect.ticket_id, "rejected")
        elif isinstance(effect, Dequeued):
            assert effect.ticket_id in self.cancel_requested, f"#{effect.ticket_id} dequeued without a cancel"
            assert effect.ticket_id not in self.granted
            self._end(effect.ticket_id, "cancelled")
        elif isinstance(effect, StartModel):
            self._started(effect)
        elif isinstance(effect, StopModel):
            assert effect.model not in self.stops, f"{effect.model} stopped twice"
            if effect.reason == "ttl":
                waiting = [t.id for t in self.tickets.values()
                           if t.model == effect.model and t.id not in self.granted and t.id not in self.ended]
                assert not waiting, f"TTL unloaded {effect.model} while {waiting} wait for it"
                assert effect.model not in self.running.values(), f"TTL unloaded {effect.model} mid-request"
            self.stops.add(effect.model)
            if effect.model in self.starts:
                self.aborted_starts[effect.model] = self.starts.pop(effect.model)
        else:
            raise AssertionError(f"unknown effect {effect!r}")

    def _granted(self, grant: Grant) -> None:
        ticket = self.tickets[grant.ticket_id]
        assert grant.ticket_id not in self.granted and grant.ticket_id not in self.ended
        assert grant.model == ticket.model and grant.decision.ticket_id == ticket.id
        assert grant.model not in self.stops, "granted a model that is being stopped"
        assert grant.model not in self.superseded, f"granted {grant.model} on a process its reload replaced"
        for target, evict in self.starts.items():
            assert grant.model not in evict, f"granted {grant.model} while the start of {target} evicts it"
        self.granted.add(grant.ticket_id)
        self.running[grant.ticket_id] = grant.model

    def _started(self, start: StartModel) -> None:
        assert start.model not in self.starts and start.model not in self.aborted_starts
        assert start.model not in self.stops, "started a model before its stop finished"
        assert start.model not in self.up, f"started {start.model} while its process is still up"
        if self.configured is not None:
            leftovers = (self.up | self.stops | set(self.starts)) - self.configured
            assert not leftovers, f"started {start.model} while removed {sorted(leftovers)} may hold the GPU"
        self.superseded.discard(start.model)
        assert any(
            t.model == start.model and t.id not in self.ended and t.id not in self.granted
            for t in self.tickets.values()
        ), f"started {start.model} although no request waits for it"
        evict = frozenset(start.evict)
        assert start.model not in evict
        busy = set(self.running.values())
        assert not evict & busy, f"evicting {sorted(evict & busy)} while serving requests"
        for target, other in self.starts.items():
            assert target not in evict and start.model not in other and not evict & other, (
                f"start of {start.model} overlaps the start of {target}"
            )
        self.starts[start.model] = evict
        self.up -= evict

    def _end(self, ticket_id: int, how: str) -> None:
        assert ticket_id in self.tickets, f"#{ticket_id} was never submitted"
        assert ticket_id not in self.ended, f"#{ticket_id} ended twice ({self.ended.get(ticket_id)}, then {how})"
        self.ended[ticket_id] = how
