"""Random interleavings against the serial scheduler placing models on described hardware (no groups: memory
alone decides what runs together): each GPU's declared use never exceeds its memory; no busy, pinned or
leased model is stopped to make room; each start's victims are the least set by (busy models, cost, models) (brute
force, with each model's cost worked out here from the requests and load times the machine saw); and the best
waiting request never waits, while nothing is under way, for a model that would fit now. Reloads remove,
rename and add GPUs under running models: those finish on their retiring GPU, then start again on a listed one.
A second machine, on hardware no reload changes and models used one request at a time to the end, makes most
starts stop others, so that the choice of victims is judged often."""

import itertools
import math
from dataclasses import replace

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from scheduling.core import ModelSpec, SerialScheduler, SerialSettings, StartModel, StopModel, SwapGroup, SwapPolicy
from scheduling.core.memory_book import UNKNOWN_LOAD_S
from scheduling.core.placement import Hardware, MemoryNeed, Resident, assign, free_memory

from .runtime_double import RuntimeDouble
from .runtime_rules import RuntimeAnswers
from .search_effort import property_settings

MODELS = ("a", "b", "c", "d", "e")
SIZES = st.sampled_from([4_000, 8_000, 12_000, 16_000])


class PlacementMachine(RuntimeAnswers, RuleBasedStateMachine):
    @initialize(gpus=st.lists(st.sampled_from([16_000, 24_000]), min_size=1, max_size=2),
                needs=st.lists(st.tuples(SIZES, st.integers(0, 2), st.booleans()), min_size=5, max_size=5),
                settings=st.builds(SerialSettings, st.sampled_from([0, 60]), st.sampled_from([0, 10])))
    def start(self, gpus, needs, settings):
        hardware = Hardware({str(i): size for i, size in enumerate(gpus)})
        self.sizes = {"0": gpus[0], "1": gpus[-1], "x": 24_000}  # a GPU keeps its size through reloads
        specs = {}
        for model, (mib, count, pinned) in zip(MODELS, needs):
            need = MemoryNeed(mib, min(count, len(gpus)))
            if assign(hardware, need, ()) is None:
                need = MemoryNeed(min(gpus), 1)
            specs[model] = ModelSpec(model, ttl=5 if model in "ab" else 0, memory=need, pinned=pinned and model == "e")
        self.set_up(hardware, specs, settings)

    def set_up(self, hardware, specs, settings):
        self.hardware, self.specs = hardware, specs
        policy = SwapPolicy([SwapGroup("(placement)", MODELS, swap=False, exclusive=False)], MODELS)
        self.scheduler = SerialScheduler(self.specs, policy, settings, self.hardware)
        self.runtime = RuntimeDouble(self.scheduler)
        self.leased: set[str] = set()
        self.leases: dict[str, tuple[str, float]] = {}
        self.arrivals: list[tuple[str, int, float]] = []  # (model, priority, when) of each request
        self.sent: dict[str, float] = {}  # when each model's latest start was sent
        self.loads: dict[str, float] = {}  # each model's latest load time, start sent to ready

    def observe(self, method, *args):
        memory = self.scheduler.memory
        starting = set(self.runtime.starts)
        before = {model: memory.gpus_of(model) for model in self.specs if memory.gpus_of(model) is not None}
        costs = {model: self.cost(model) for model in before}
        reasons = {model: memory.protection(model) for model in before}
        if method == "answer_start" and args[1]:
            self.loads[args[0]] = self.runtime.now - self.sent[args[0]]
        effects = getattr(self.runtime, method)(*args)
        # Protected as the call left them: pinned, within minResidency, or leased still (a call may end a lease).
        protected = {m for m, why in reasons.items() if why and (not why.startswith("lease") or memory.leased(m))}
        # Busy as the call left them: running a job, or a start under way before and after it.
        busy = set(self.runtime.running.values()) | (starting & set(self.runtime.starts))
        leased_before = set(self.leased)
        for stop in (e for e in effects if isinstance(e, StopModel) and e.reason == "ttl"):
            assert stop.model not in leased_before, f"{stop}: a leased model unloaded by its TTL"
        placed = dict(before)  # as each start of the call leaves it, for the next
        for start in (e for e in effects if isinstance(e, StartModel)):
            assert not set(start.evict) & (busy | protected | self.leased), f"{start} stops a busy or protected model"
            self.check_least_cost(start, placed, costs, busy, protected)
            self.sent[start.model] = self.runtime.now
            placed = {m: gpus for m, gpus in placed.items() if m not in start.evict} | {start.model: start.gpus}
            costs[start.model], busy = self.cost(start.model), busy | {start.model}
        return effects

    def cost(self, model: str) -> float:
        """What stopping `model` costs now, by the formula the docs give: its load time (a model never loaded: the
        mean of the measured ones) × (1 − e^−demand), demand = Σ 2^(priority/100) over its requests of the last 600 s,
        per minute."""
        loaded = list(self.loads.values())
        load_s = self.loads.get(model, sum(loaded) / len(loaded) if loaded else UNKNOWN_LOAD_S)
        now = self.runtime.now
        demand = sum(2 ** (p / 100) for m, p, at in self.arrivals if m == model and now - 600 < at) * 60 / 600
        return load_s * (1 - math.exp(-demand))

    def check_least_cost(self, start, placed, costs, busy, untouchable):
        """No set of the models it could stop frees the room with fewer busy models, then at less cost, then with
        fewer models."""
        residents = [replace(r, cost=costs[r.model], busy=r.model in busy) for r in self.listed(placed)
                     if r.model != start.model and r.model not in self.runtime.stops]
        need = self.specs[start.model].memory

        def rank(subset):
            return sum(r.busy for r in subset), sum(r.cost for r in subset), len(subset)

        chosen = rank([r for r in residents if r.model in start.evict])
        evictable = [r for r in residents if r.model not in untouchable]
        for size in range(len(evictable) + 1):
            for subset in itertools.combinations(evictable, size):
                if assign(self.hardware, need, [r for r in residents if r not in subset]) is None:
                    continue
                busy_n, cost, count = rank(subset)
                same_cost = abs(cost - chosen[1]) <= 1e-9
                better = busy_n < chosen[0] or busy_n == chosen[0] and (
                    cost < chosen[1] - 1e-9 or same_cost and count < chosen[2])
                assert not better, f"{start}: (busy, cost, models) {chosen}, {sorted(r.model for r in subset)} less"

    @rule(model=st.sampled_from(MODELS), priority=st.sampled_from([-100, 0, 100]))
    def submit(self, model, priority):
        self.arrivals.append((model, priority, self.runtime.now))
        self.observe("call", "submit", self.runtime.new_ticket(model, priority))

    @rule(model=st.sampled_from(MODELS), on=st.booleans(), seconds=st.sampled_from([5, 1e9]))
    def lease(self, model, on, seconds):
        if on:
            self.leases[model] = ("lease #1", self.runtime.now + seconds)
        else:
            self.leases.pop(model, None)
        self.leased = {m for m, (_, until) in self.leases.items() if self.runtime.now < until}
        self.observe("call", "apply_leases", dict(self.leases))

    @rule(ids=st.lists(st.sampled_from(["0", "1", "x"]), min_size=1, max_size=2, unique=True))
    def reload_hardware(self, ids):
        """A reload listing these GPUs: a model on more GPUs than remain is cut down to them (so restarted)."""
        self.hardware = Hardware({gpu: self.sizes[gpu] for gpu in ids})
        specs = {m: replace(spec, memory=MemoryNeed(spec.memory.mib, min(spec.memory.gpus, len(ids))))
                 for m, spec in self.specs.items()}
        restart = [m for m in MODELS if specs[m] != self.specs[m]]
        self.specs = specs
        policy = SwapPolicy([SwapGroup("(placement)", MODELS, swap=False, exclusive=False)], MODELS)
        self.observe("reconfigure", specs, policy, restart, self.hardware)

    def listed(self, placed=None) -> list[Resident]:
        """The models holding memory (`placed`, else now) as placement counts them: on the GPUs listed now (none on
        retiring ones)."""
        residents = []
        for model, gpus in (self.scheduler.memory.placed() if placed is None else placed).items():
            listed = tuple(gpu for gpu in gpus if gpu in self.hardware.gpus)
            if listed or not gpus:
                residents.append(Resident(model, listed, self.specs[model].memory.mib))
        return residents

    @invariant()
    def the_next_deadline_is_ahead(self):
        deadline = self.scheduler.next_deadline()
        assert deadline is None or deadline > self.runtime.now

    @rule(seconds=st.sampled_from([1, 30, 600]))
    def wait(self, seconds):
        self.runtime.now += seconds
        self.leased = {m for m, (_, until) in self.leases.items() if self.runtime.now < until}
        self.observe("call", "tick")

    @invariant()
    def no_gpu_holds_more_than_it_has(self):
        memory = self.scheduler.memory
        gpus, _ = free_memory(self.hardware, self.listed())
        assert all(free >= 0 for free in gpus.values()), f"over capacity: {gpus} with {memory.placed()}"

    @invariant()
    def the_best_waiting_request_never_waits_for_room_it_has(self):
        """Requests below it may be held back for it (its model's memory is kept free for it)."""
        if self.runtime.starts or self.runtime.stops:
            return
        ranked = self.scheduler.ranked(self.runtime.now)
        if not ranked:
            return
        memory = self.scheduler.memory
        placed = self.listed()
        model = ranked[0][0].model
        if model in memory.placed() or model in set(self.runtime.running.values()):
            return  # loaded, or its crashed process's jobs are not reported ended yet
        assert assign(self.hardware, self.specs[model].memory, placed) is None, (
            f"#{ranked[0][0].id} for {model} waits though it fits beside {memory.placed()}")


test_placement_properties = PlacementMachine.TestCase
test_placement_properties.settings = property_settings(150, stateful_step_count=40)


class EvictionMachine(PlacementMachine):
    """The same checks on hardware no reload changes, filled by models of one GPU each, used one request at a time to
    the end (`use`) as well as piecemeal: most starts stop others, so the choice of victims is judged often, on costs
    that come and go with demand (`wait`) and load times that differ."""

    reload_hardware = lease = crash = None  # not rules here: this machine judges the victims chosen

    @initialize(gpus=st.integers(1, 2), sizes=st.lists(st.sampled_from([4_000, 8_000, 12_000]), min_size=5, max_size=5))
    def start(self, gpus, sizes):
        specs = {model: ModelSpec(model, memory=MemoryNeed(mib)) for model, mib in zip(MODELS, sizes)}
        self.set_up(Hardware({str(i): 16_000 for i in range(gpus)}), specs, SerialSettings())

    @rule(model=st.sampled_from(MODELS), priority=st.sampled_from([-100, 0, 100]), load_s=st.sampled_from([1, 5, 40]))
    def use(self, model, priority, load_s):
        """A request for `model`, then everything owed answered, each start after `load_s`, until nothing is left."""
        self.submit(model, priority)
        while True:
            if self.runtime.stops:
                self.observe("answer_stop", min(self.runtime.stops))
            elif self.runtime.starts:
                self.runtime.now += load_s
                self.observe("answer_start", min(self.runtime.starts), True)
            elif self.runtime.running:
                self.observe("finish", min(self.runtime.running))
            else:
                return


test_stopped_models_are_the_least_set = EvictionMachine.TestCase
test_stopped_models_are_the_least_set.settings = property_settings(150, stateful_step_count=40)


def test_gpu_renames_under_a_failing_start_never_put_two_models_over_one_gpu():
    """The machine's shrunk example once found over capacity (an 8 000 and a 12 000 MiB model on one 16 000 MiB
    GPU): reloads renaming GPU 0 → 1 → 0 while a start fails, the last while d stops for b's start. Its steps, with
    every invariant checked after each."""
    machine = PlacementMachine()
    machine.start(gpus=[16_000], needs=[(4_000, 0, False), (12_000, 1, False), (4_000, 0, False), (8_000, 1, False),
                                        (4_000, 0, False)], settings=SerialSettings(0, 0))
    steps = [(machine.submit, "d", -100), (machine.reload_hardware, ["0"]), (machine.reload_hardware, ["1"]),
             (machine.observe, "answer_start", "d", False), (machine.lease, "a", False, 5),
             (machine.observe, "answer_start", "d", True), (machine.submit, "b", -100), (machine.observe, "finish", 1),
             (machine.reload_hardware, ["0"]), (machine.observe, "answer_start", "b", False)]
    for rule, *args in steps:
        rule(*args)
        machine.no_gpu_holds_more_than_it_has()
        machine.the_best_waiting_request_never_waits_for_room_it_has()
        machine.the_next_deadline_is_ahead()
