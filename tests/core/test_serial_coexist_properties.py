"""Random interleavings against the serial scheduler on hardware where models share the GPU: random
swap groups (any mix of swap, exclusive and persistent) or random matrix sets, random job slots,
arrivals (alone, or several queued in one call), finishes, crashes, cancels, unloads and slot edits. Each step is checked against a
brute-force reference written from the double's own account of the processes, not from the
scheduler: models that may not run together never do, no model gets more jobs than its slots, each
model's slots go to its best-scoring requests, and a request never waits while it could run without
evicting busy work or taking what a higher-scoring request has reserved. Every request ends once."""

import itertools
from dataclasses import dataclass, replace

from hypothesis import strategies as st
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
from .runtime_rules import RuntimeAnswers
from .scoring import best_first
from .search_effort import property_settings

MODELS = ("a", "b", "c", "d")
PRIORITIES = st.sampled_from([-100, -1, 0, 1, 2, 100])
SLOTS = st.fixed_dictionaries({m: st.sampled_from([1, 1, 2, 3]) for m in MODELS})
PROMISED = 0  # the reserver of the models a launch waiting for stops will evict: no request


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

    def launching(self, submitting=frozenset()) -> set[str]:
        """Models of requests that left the queue without a grant yet: each holds a slot of its
        model while the model starts (or waits to start). Requests `submitting` (made, not yet
        submitted) have not been in the queue at all."""
        return {self.tickets[i].model for i in self.dispatched(submitting)}

    def dispatched(self, submitting=frozenset()) -> set[int]:
        """Requests that left the queue without a grant yet."""
        queued = {t.id for t, _ in self.scheduler.ranked(self.now)}
        return self.waiting() - queued - set(submitting)

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


class CoexistMachine(RuntimeAnswers, RuleBasedStateMachine):
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

    def observe(self, method, *args, submitted=()):
        """Carry out a call. Every request it dispatched, `submitted` ones (queued by the call
        itself) included, must be its model's best waiting one; none may have taken a model that a
        better request still waiting has reserved for its swap, or been given a start in that
        swap's way (a start is judged by the walk as it stood when picked: without itself); and
        none may have taken, or started a model in the way of, what a start promised before the
        call and still waiting after it will evict."""
        runtime = self.runtime
        submitting = {t.id for t in submitted}
        before = {t.id for t in self.queued()} | submitting
        promised = self.promised_starts(submitting)
        holding = runtime.holding() | runtime.launching(submitting)
        effects = getattr(runtime, method)(*args)
        queued = self.queued()
        loaded = runtime.up - runtime.stops
        walked = self.reference_walk()
        still_promised = self.promised_starts().keys()
        current = {t.id: t for t in queued}  # with the priorities requests were re-ranked to

        def beats(ticket, other) -> bool:
            return best_first([ticket, other], runtime.now, loaded, self.settings)[0] is ticket

        for ticket_id in before - current.keys() - runtime.ended.keys():
            picked = runtime.tickets[ticket_id]
            better = [t for t in queued if t.model == picked.model and beats(t, picked)]
            assert not better, f"#{picked.id} went before #{better[0].id}, which scores better for {picked.model}"
            # A start is judged against what the walk saw when it was picked: without itself.
            launched = picked.id not in runtime.granted
            _, reserved, targets = self.reference_walk(picked.id) if launched else walked
            holder = current.get(reserved.get(picked.model))
            assert holder is None or not beats(holder, picked), (
                f"#{picked.id} took {picked.model}, which better-scoring #{holder.id} reserved for its swap"
            )
            if launched:
                beside = (runtime.holding() | runtime.launching({picked.id})) - {picked.model}
                own = self.rules.evictions(picked.model, beside - {picked.model})
                for target, holder_id in targets:
                    holder = current.get(holder_id)
                    assert holder is None or not beats(holder, picked) or self._leaves_alone(
                        picked.model, own, target, beside
                    ), f"#{picked.id} was given a start of {picked.model}, in the way of better-scoring #{holder.id}'s swap"
            for (target, promised_to), victims in promised.items():
                if (target, promised_to) not in still_promised:
                    continue  # cancelled, or sent: what it evicts is stopping now
                promise = f"the start of {target} promised to #{promised_to}"
                assert picked.model not in victims, f"#{picked.id} took {picked.model}, which {promise} evicts"
                own = self.rules.evictions(picked.model, holding - {picked.model})
                assert picked.id in runtime.granted or self._leaves_alone(picked.model, own, target, holding), (
                    f"#{picked.id} was given a start of {picked.model}, which stands in the way of {promise}"
                )
        return effects

    @rule(model=st.sampled_from(MODELS), priority=PRIORITIES)
    def submit(self, model, priority):
        ticket = self.runtime.new_ticket(model, priority)
        self.observe("call", "submit", ticket, submitted=[ticket])

    @rule(data=st.data(), priorities=st.lists(PRIORITIES, min_size=2, max_size=3),
          others=st.lists(st.tuples(st.sampled_from(MODELS), PRIORITIES), max_size=2))
    def submit_together(self, data, priorities, others):
        """Requests queued in one call (a worker taking over a queue), several for one model,
        loaded when one is: the call may have to grant more than once."""
        model = data.draw(st.sampled_from(sorted(self.runtime.up - self.runtime.stops) or MODELS))
        requests = [(model, priority) for priority in priorities] + others
        tickets = [self.runtime.new_ticket(m, priority) for m, priority in requests]
        self.observe("call", "submit_all", tickets, submitted=tickets)

    @precondition(lambda self: self.runtime.tickets)
    @rule(data=st.data())
    def cancel(self, data):
        self.observe("cancel", data.draw(st.sampled_from(sorted(self.runtime.tickets))))

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

    def reference_walk(self, leaving_out: int | None = None) -> tuple[list[str], dict[str, int], list[tuple[str, int]]]:
        """Walk the queue best first as the reference scheduler would: a request may wait only
        behind a full model, a start under way, busy work its own start would evict, or what a
        better request (or a start already promised) has reserved. A request whose start must
        wait for stops leaves the queue at once: its start follows them. Returns the requests
        waiting without such a reason, which request reserved each model (PROMISED: a start),
        and the swaps waiting, best first, with their requests. `leaving_out`: a request whose
        start the call just dispatched, walked as things stood when the call picked it."""
        runtime = self.runtime
        out = set() if leaving_out is None else {leaving_out}
        left_out = {runtime.tickets[i].model for i in out}
        launching = runtime.launching(out)
        holding = (runtime.holding() | launching) - left_out
        loaded = runtime.up - runtime.stops
        queued = self.queued()
        busy = (set(runtime.running.values()) | set(runtime.starts) | launching) - left_out
        reserved: dict[str, int] = {}
        targets: list[tuple[str, int]] = []
        for (model, _), victims in self.promised_starts(out).items():  # they keep their victims idle
            reserved.update(dict.fromkeys(victims, PROMISED))
            targets.append((model, PROMISED))
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
            victims = self.rules.evictions(model, holding - {model})
            if model in runtime.evicting():  # a start under way (or cut short, until it reports) stops it first:
                for victim in victims | {model}:  # it goes once that start ends, and nothing below gets in first
                    reserved.setdefault(victim, ticket.id)
                targets.append((model, ticket.id))
                continue
            if any(not self._leaves_alone(model, victims, target, holding) for target, _ in targets):
                continue
            if (victims | {model}) & busy:
                for victim in victims | {model}:
                    reserved.setdefault(victim, ticket.id)
                targets.append((model, ticket.id))
                continue
            idle.append(f"#{ticket.id} waits although {model} could start, evicting only idle {sorted(victims)}")
        return idle, reserved, targets

    def promised_starts(self, leaving_out=frozenset()) -> dict[tuple[str, int], frozenset[str]]:
        """Starts promised to a dispatched request but not sent yet (they wait for stops), keyed
        by (model, request), each with what it will evict from what holds the GPU now; requests
        `leaving_out` (not submitted yet, or dispatched by the call being judged) aside."""
        runtime = self.runtime
        holding = runtime.holding() | runtime.launching(leaving_out)
        promised = {(runtime.tickets[i].model, i) for i in runtime.dispatched(leaving_out)}
        return {
            (model, i): frozenset(self.rules.evictions(model, holding - {model}))
            for model, i in promised
            if model not in runtime.starts
        }

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


CoexistMachine.TestCase.settings = property_settings(300, stateful_step_count=50)
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


def test_one_call_that_frees_two_slots_grants_two_requests():
    """Raising a model's slots from 1 to 3 while three requests wait for it must grant two of them
    in that one call, best first, and leave the third waiting for a slot."""
    state = CoexistMachine()
    state.start(rules=GroupRules(groups=()), slots={}, aging=0, bonus=0)
    for priority in (0, 1, 3, 2):
        state.submit(model="a", priority=priority)
    state.observe("answer_start", "a", True)  # the first request runs; three wait for a slot
    state.settings = state.runtime.settings = SerialSettings(0, 0, {"a": 3})
    effects = state.observe("call", "retune", state.settings)
    assert [e.ticket_id for e in effects if isinstance(e, Grant)] == [3, 4]
    state.nothing_waits_that_could_run()
    state.teardown()


def test_a_start_waiting_for_a_stop_keeps_what_it_will_evict_idle():
    """c (exclusive) is dispatched while b is being unloaded by its TTL: its start waits for that
    stop, and will evict a too. A request for a, idle and up, arriving meanwhile waits: given a,
    it would keep c's start waiting for its job as well."""
    state = CoexistMachine()
    exclusive = SwapGroup("g1", ("c",), swap=False, exclusive=True, persistent=False)
    beside = (SwapGroup("g2", ("a",), exclusive=False), SwapGroup("g3", ("b",), exclusive=False))
    state.start(rules=GroupRules(groups=(exclusive, *beside)), slots={}, aging=0, bonus=0)
    for model in ("a", "b"):
        state.submit(model=model, priority=0)
        state.observe("answer_start", model, True)
    for ticket_id in sorted(state.runtime.running):
        state.observe("finish", ticket_id)
    state.wait(seconds=10)
    state.tick()  # b's TTL (5 s) has passed: b is being stopped
    state.submit(model="c", priority=0)
    assert state.promised_starts() == {("c", 3): {"a", "b"}}
    state.submit(model="a", priority=100)
    assert [t.id for t in state.queued()] == [4], "a is kept idle for c's start"
    state.observe("answer_stop", "b")
    assert set(state.runtime.starts) == {"c"} and state.runtime.starts["c"] == {"a"}
    state.teardown()


def test_a_lower_scoring_request_does_not_take_a_model_a_waiting_swap_reserved():
    """Three calls: #1 runs on a (one slot of two); #2 (priority 100) for b must stop a, so it
    waits for #1 and reserves a; #3 (priority -1) for a arrives. a has a free slot, but giving it
    to #3 would make #2 wait for #3 too: #3 waits, and goes after #2."""
    state = CoexistMachine()
    state.start(rules=GroupRules(groups=()), slots={"a": 2}, aging=0, bonus=0)
    state.submit(model="a", priority=0)
    state.observe("answer_start", "a", True)
    state.submit(model="b", priority=100)
    state.submit(model="a", priority=-1)
    assert [t.id for t in state.queued()] == [2, 3]
    state.observe("finish", 1)
    assert set(state.runtime.starts) == {"b"}
    state.teardown()
