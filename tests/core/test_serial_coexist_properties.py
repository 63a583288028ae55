"""Random interleavings against the serial scheduler on hardware where models share the GPU: random
swap groups (any mix of swap, exclusive and persistent) or random matrix sets, random job slots,
arrivals, finishes, crashes, cancels, unloads and slot edits. Each step is checked against a
brute-force reference written from the double's own account of the processes, not from the
scheduler: models that may not run together never do, no model gets more jobs than its slots, each
model's slots go to its best-scoring requests, and a request never waits while it could run without
evicting busy work or taking what a higher-scoring request has reserved. Every request ends once."""

import itertools
from dataclasses import dataclass, replace

from hypothesis import settings as hypothesis_settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from scheduling.core import (
    Grant,
    MatrixPolicy,
    MatrixSet,
    ModelSpec,
    SerialScheduler,
    SerialSettings,
    StartModel,
    SwapGroup,
    SwapPolicy,
)

from .runtime_double import RuntimeDouble
from .scoring import best_first

MODELS = ("a", "b", "c", "d")
PRIORITIES = st.sampled_from([-100, -1, 0, 1, 2, 100])
SLOTS = st.fixed_dictionaries({m: st.sampled_from([1, 1, 2, 3]) for m in MODELS})


# -- the routers, written out the slow way ----------------------------------------------------


@dataclass(frozen=True)
class GroupRules:
    """llama-swap's group rules, pair by pair: starting `target` stops `other` when they share a
    swapping group, or when the target's group is exclusive and the other's is not persistent."""

    groups: tuple[SwapGroup, ...]

    def _group(self, model: str) -> SwapGroup:
        for group in self.groups:
            if model in group.members:
                return group
        return SwapGroup("ungrouped", ())  # models in no group: one swapping, exclusive group

    def stops(self, target: str, other: str) -> bool:
        mine, theirs = self._group(target), self._group(other)
        if mine.name == theirs.name:
            return mine.swap
        return mine.exclusive and not theirs.persistent

    def evictions(self, target: str, holding) -> set[str]:
        return {other for other in holding if other != target and self.stops(target, other)}

    def may_hold_together(self, models) -> bool:
        """No two of `models` stop each other whichever starts second (one direction is allowed:
        a non-exclusive group's model may start beside an exclusive group)."""
        return not any(self.stops(x, y) and self.stops(y, x) for x in models for y in models if x < y)

    def policy(self) -> SwapPolicy:
        return SwapPolicy(self.groups, MODELS)


@dataclass(frozen=True)
class MatrixRules:
    """The matrix by enumeration: every combination holding the target, cheapest eviction first,
    the first defined among equals; a model in no set runs alone."""

    sets: tuple[MatrixSet, ...]
    costs: tuple[tuple[str, int], ...]

    def evictions(self, target: str, holding) -> set[str]:
        others = set(holding) - {target}
        cost = dict(self.costs)
        options = [
            (sum(cost.get(m, 1) for m in others - combination), index, others - combination)
            for index, combination in enumerate(c for s in self.sets for c in s.combinations)
            if target in combination
        ]
        return min(options, key=lambda option: option[:2])[2] if options else others

    def may_hold_together(self, models) -> bool:
        models = set(models)
        return len(models) <= 1 or any(models <= c for s in self.sets for c in s.combinations)

    def policy(self) -> MatrixPolicy:
        return MatrixPolicy(self.sets, dict(self.costs))


@st.composite
def group_rules(draw) -> GroupRules:
    assignment = draw(st.lists(st.sampled_from([None, "g1", "g2", "g3"]), min_size=4, max_size=4))
    groups = []
    for name in ("g1", "g2", "g3"):
        members = tuple(m for m, g in zip(MODELS, assignment) if g == name)
        if members:
            swap, exclusive, persistent = draw(st.tuples(st.booleans(), st.booleans(), st.booleans()))
            groups.append(SwapGroup(name, members, swap, exclusive, persistent))
    return GroupRules(tuple(groups))


@st.composite
def matrix_rules(draw) -> MatrixRules:
    combination = st.frozensets(st.sampled_from(MODELS), min_size=1, max_size=4)
    sets = tuple(
        MatrixSet(f"s{n}", tuple(draw(st.lists(combination, min_size=1, max_size=3))))
        for n in range(draw(st.integers(1, 3)))
    )
    costs = draw(st.dictionaries(st.sampled_from(MODELS), st.integers(1, 3)))
    return MatrixRules(sets, tuple(sorted(costs.items())))


# -- the runtime double, checking every effect as it is carried out ---------------------------


class CheckedRuntime(RuntimeDouble):
    def __init__(self, scheduler, rules, settings: SerialSettings) -> None:
        super().__init__(scheduler)
        self.rules = rules
        self.settings = settings

    def holding(self) -> set[str]:
        """Models holding the GPU by the double's account: up (even while being stopped), starting,
        stopped by a start under way (until that start ends), or still running jobs on a process
        that exited."""
        return self.up | self.stops | set(self.starts) | self.evicting() | set(self.running.values())

    def evictions(self) -> dict[str, frozenset[str]]:
        """What each start under way (or cut short, until it reports) stops first."""
        return {**self.starts, **self.aborted_starts}

    def evicting(self) -> set[str]:
        return set().union(*self.evictions().values())

    def launching(self) -> set[str]:
        """Models of requests that left the queue without a grant yet: each holds a slot of its
        model while the model starts (or waits to start)."""
        queued = {t.id for t, _ in self.scheduler.ranked(self.now)}
        return {self.tickets[i].model for i in self.waiting() - queued}

    def jobs_on(self, model: str) -> int:
        return sum(1 for m in self.running.values() if m == model)

    def _granted(self, grant: Grant) -> None:
        slots = self.settings.slots_for(grant.model)
        assert self.jobs_on(grant.model) < slots, f"a job beyond {grant.model}'s {slots} slots"
        assert grant.model in self.up - self.stops, f"granted {grant.model}, which is not up"
        assert grant.decision.slot is not None and 1 <= grant.decision.slot <= max(slots, self.jobs_on(grant.model) + 1)
        super()._granted(grant)

    def _started(self, start: StartModel) -> None:
        holding = self.holding() - {start.model}
        # Requests dispatched in the same call hold slots of their models: those dispatched before
        # this start count in its choice (for the matrix, the cheapest set depends on them).
        launching = sorted(self.launching() - holding - {start.model})
        expected = [
            self.rules.evictions(start.model, holding | set(chosen))
            for n in range(len(launching) + 1)
            for chosen in itertools.combinations(launching, n)
        ]
        assert set(start.evict) in expected, (
            f"starting {start.model} beside {sorted(holding)} (and some of {launching}) evicts one of {expected}, "
            f"not {list(start.evict)}"
        )
        busy = sorted(set(start.evict) & (set(self.running.values()) | set(self.starts) | self.stops))
        assert not busy, f"starting {start.model} evicts {busy} while they serve, start or stop"
        super()._started(start)


class CoexistMachine(RuleBasedStateMachine):
    @initialize(
        rules=st.one_of(group_rules(), matrix_rules()),
        slots=SLOTS,
        aging=st.sampled_from([0, 1, 60]),
        bonus=st.sampled_from([0, 10]),
    )
    def start(self, rules, slots, aging, bonus):
        self.rules = rules
        self.settings = SerialSettings(aging, bonus, slots)
        models = {m: ModelSpec(m, ttl=ttl) for m, ttl in zip(MODELS, (0, 5, 0, 60))}
        self.scheduler = SerialScheduler(models, rules.policy(), self.settings)
        self.runtime = CheckedRuntime(self.scheduler, rules, self.settings)

    def queued(self):
        return [t for t, _ in self.scheduler.ranked(self.runtime.now)]

    def observe(self, method, *args):
        """Carry out a call. Every request it dispatched must be its model's best waiting one, and
        none may have taken a model that a better request still waiting has reserved for its swap."""
        runtime = self.runtime
        before = {t.id: t for t in self.queued()}
        effects = getattr(runtime, method)(*args)
        queued = self.queued()
        loaded = runtime.up - runtime.stops
        reserved = self.reference_walk()[1]
        current = {t.id: t for t in queued}  # with the priorities requests were re-ranked to
        for ticket_id in before.keys() - {t.id for t in queued} - runtime.ended.keys():
            picked = runtime.tickets[ticket_id]
            better = [
                t for t in queued
                if t.model == picked.model and best_first([t, picked], runtime.now, loaded, self.settings)[0] is t
            ]
            assert not better, f"#{picked.id} went before #{better[0].id}, which scores better for {picked.model}"
            holder = current.get(reserved.get(picked.model, 0))
            assert holder is None or best_first([holder, picked], runtime.now, loaded, self.settings)[0] is picked, (
                f"#{picked.id} took {picked.model}, which better-scoring #{holder.id} reserved for its swap"
            )
        return effects

    @rule(model=st.sampled_from(MODELS), priority=PRIORITIES)
    def submit(self, model, priority):
        ticket = self.runtime.new_ticket(model, priority)
        self.observe("call", "submit", ticket)

    @precondition(lambda self: self.runtime.tickets)
    @rule(data=st.data())
    def cancel(self, data):
        self.observe("cancel", data.draw(st.sampled_from(sorted(self.runtime.tickets))))

    @precondition(lambda self: self.runtime.running)
    @rule(data=st.data())
    def finish(self, data):
        self.observe("finish", data.draw(st.sampled_from(sorted(self.runtime.running))))

    @precondition(lambda self: self.runtime.starts)
    @rule(data=st.data(), ok=st.booleans())
    def start_outcome(self, data, ok):
        self.observe("answer_start", data.draw(st.sampled_from(sorted(self.runtime.starts))), ok)

    @precondition(lambda self: self.runtime.stops)
    @rule(data=st.data())
    def stop_done(self, data):
        self.observe("answer_stop", data.draw(st.sampled_from(sorted(self.runtime.stops))))

    @precondition(lambda self: self.runtime.up - self.runtime.stops)
    @rule(data=st.data())
    def crash(self, data):
        self.observe("crash", data.draw(st.sampled_from(sorted(self.runtime.up - self.runtime.stops))))

    @rule(seconds=st.sampled_from([0.25, 1, 10, 600]))
    def wait(self, seconds):
        self.runtime.now += seconds

    @rule()
    def tick(self):
        self.observe("call", "tick")

    @rule(slots=SLOTS)
    def edit_slots(self, slots):
        self.settings = SerialSettings(self.settings.aging_divisor, self.settings.swap_affinity_bonus, slots)
        self.runtime.settings = self.settings
        self.observe("call", "retune", self.settings)

    @rule(data=st.data(), priority=PRIORITIES)
    def reprioritize(self, data, priority):
        if self.runtime.tickets:
            ticket_id = data.draw(st.sampled_from(sorted(self.runtime.tickets)))
            if ticket_id in {t.id for t in self.queued()}:  # only a waiting request is re-ranked
                self.runtime.tickets[ticket_id] = replace(self.runtime.tickets[ticket_id], priority=priority)
            self.observe("call", "reprioritize", ticket_id, priority)

    @rule(models=st.none() | st.sets(st.sampled_from(MODELS)))
    def unload(self, models):
        self.observe("call", "unload", models)

    # -- invariants ---------------------------------------------------------------------------

    @invariant()
    def models_that_may_not_run_together_never_do(self):
        """Only a start and what it stops first overlap: those stops end before its process runs."""
        holding = self.runtime.holding()
        evicting = self.runtime.evicting()
        together = holding - evicting
        assert self.rules.may_hold_together(together), f"{sorted(together)} hold the GPU together"
        for target, evicted in self.runtime.evictions().items():
            for victim in evicted:
                beside = (together - {target}) | {victim}
                assert self.rules.may_hold_together(beside), f"{victim} still stopping beside {sorted(beside)}"

    @invariant()
    def the_scheduler_agrees_on_what_runs(self):
        snapshot = self.scheduler.snapshot(self.runtime.now)
        assert set(snapshot.running_tickets) == set(self.runtime.running)
        assert set(snapshot.loaded) == self.runtime.up - self.runtime.stops
        for model, tickets in snapshot.running.items():
            assert len(tickets) <= max(self.settings.slots_for(model), self.runtime.jobs_on(model))

    @invariant()
    def nothing_waits_that_could_run(self):
        idle = self.reference_walk()[0]
        assert not idle, idle[0]

    def reference_walk(self) -> tuple[list[str], dict[str, int]]:
        """Walk the queue best first as the reference scheduler would: a request may wait only
        behind a full model, a start under way, busy work its own start would evict, or what a
        better request (or a start already promised) has reserved. A request whose start must
        wait for stops leaves the queue at once: its start follows them. Returns the requests
        waiting without such a reason, and which request reserved each model (0: a start)."""
        runtime = self.runtime
        launching = runtime.launching()
        holding = runtime.holding() | launching
        loaded = runtime.up - runtime.stops
        queued = self.queued()
        busy = set(runtime.running.values()) | set(runtime.starts) | launching
        reserved: dict[str, int] = {}
        targets: list[str] = []
        for model in launching - set(runtime.starts):  # promised starts keep their victims idle
            reserved.update(dict.fromkeys(self.rules.evictions(model, holding - {model}), 0))
            targets.append(model)
        idle = []
        for ticket in best_first(queued, runtime.now, loaded, self.settings):
            model = ticket.model
            if model in reserved:
                continue
            if model in loaded:
                if runtime.jobs_on(model) < self.settings.slots_for(model):
                    idle.append(f"#{ticket.id} waits although {model} is up with a free slot")
                continue
            if model in runtime.starts or model in launching:
                continue
            if model in runtime.evicting():
                continue  # a start under way (or cut short, until it reports) stops it first
            victims = self.rules.evictions(model, holding - {model})
            if any(not self._leaves_alone(model, victims, target, holding) for target in targets):
                continue
            if (victims | {model}) & busy:
                for victim in victims | {model}:
                    reserved.setdefault(victim, ticket.id)
                targets.append(model)
                continue
            idle.append(f"#{ticket.id} waits although {model} could start, evicting only idle {sorted(victims)}")
        return idle, reserved

    def _leaves_alone(self, model, victims, target, holding) -> bool:
        """Whether starting `model` leaves a reserved swap to `target` no more to evict."""
        before = self.rules.evictions(target, holding - {target})
        after = (holding - victims) | {model}
        return self.rules.evictions(target, after - {target}) <= before

    def teardown(self):
        if not hasattr(self, "runtime"):
            return
        self.runtime.settle()
        assert set(self.runtime.ended) == set(self.runtime.tickets), "some requests never ended"
        assert self.scheduler.snapshot(self.runtime.now).waiting == 0


CoexistMachine.TestCase.settings = hypothesis_settings(max_examples=300, stateful_step_count=50, deadline=None)
test_serial_scheduler_on_shared_hardware = CoexistMachine.TestCase


def test_a_model_a_cut_short_start_was_stopping_waits_until_that_start_reports():
    """Found by the machine: b, stopped first by a's start, is asked for again after an unload cut
    that start short. Until the start reports, b may still be being stopped: the request waits."""
    state = CoexistMachine()
    state.start(rules=GroupRules(groups=()), slots={}, aging=0, bonus=0)
    state.submit(model="b", priority=-100)
    state.observe("cancel", min(state.runtime.tickets))
    state.observe("answer_start", "b", True)
    state.submit(model="a", priority=-100)  # starts a, stopping b first
    state.unload(models=None)  # cuts a's start short; it has not reported yet
    state.submit(model="b", priority=-100)
    state.nothing_waits_that_could_run()
    assert state.queued(), "b waits for the start that stops it to report"
    state.teardown()
