"""Random interleavings against the fifo scheduler: no request lost or duplicated, concurrency
limits never exceeded, and no model granted while a start that evicts it runs."""

from collections import Counter

from hypothesis import settings as hypothesis_settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from scheduling.core import FifoScheduler, ModelSpec, SerialSettings, SwapGroup, SwapPolicy

from .runtime_double import RuntimeDouble

MODELS = ("a", "b", "c", "d")
POLICIES = {
    "one at a time": [],
    "a+b share the GPU": [SwapGroup("ab", ("a", "b"), swap=False)],
    "c and d beside the rest": [SwapGroup("c", ("c",), exclusive=False), SwapGroup("d", ("d",), exclusive=False)],
    "exclusive a, non-exclusive c": [SwapGroup("a", ("a",)), SwapGroup("c", ("c",), exclusive=False)],
    "persistent d": [SwapGroup("d", ("d",), persistent=True)],
}
LIMITS = {"a": 2, "b": 3, "c": 1, "d": 10}


class FifoMachine(RuleBasedStateMachine):
    @initialize(policy=st.sampled_from(sorted(POLICIES)), ttl=st.sampled_from([0, 5]))
    def start(self, policy, ttl):
        models = {
            m: ModelSpec(m, ttl=ttl if m in "ab" else 0, concurrency_limit=LIMITS[m], fifo_priority=i * 5)
            for i, m in enumerate(MODELS)
        }
        self.scheduler = FifoScheduler(models, SwapPolicy(POLICIES[policy], MODELS), SerialSettings())
        self.runtime = RuntimeDouble(self.scheduler)

    @rule(model=st.sampled_from(MODELS), priority=st.sampled_from([-100, 0, 3, 100]))
    def submit(self, model, priority):
        ticket = self.runtime.new_ticket(model, priority)
        self.runtime.call("submit", ticket)

    @rule(data=st.data())
    def cancel(self, data):
        self.runtime.cancel(data.draw(st.sampled_from(sorted(self.runtime.tickets) + [10_000])))

    @precondition(lambda self: self.runtime.running)
    @rule(data=st.data())
    def finish(self, data):
        self.runtime.finish(data.draw(st.sampled_from(sorted(self.runtime.running))))

    @precondition(lambda self: self.runtime.starts)
    @rule(data=st.data(), ok=st.booleans())
    def start_outcome(self, data, ok):
        self.runtime.answer_start(data.draw(st.sampled_from(sorted(self.runtime.starts))), ok)

    @precondition(lambda self: self.runtime.stops)
    @rule(data=st.data())
    def stop_done(self, data):
        self.runtime.answer_stop(data.draw(st.sampled_from(sorted(self.runtime.stops))))

    @rule(data=st.data())
    def crash(self, data):
        loaded = self.scheduler.snapshot(self.runtime.now).loaded
        if loaded:
            self.runtime.call("model_stopped", data.draw(st.sampled_from(loaded)))

    @rule(seconds=st.sampled_from([0.25, 1, 6]))
    def wait(self, seconds):
        self.runtime.now += seconds

    @rule()
    def tick(self):
        self.runtime.call("tick")

    @rule(data=st.data(), priority=st.sampled_from([-100, 0, 100]))
    def reprioritize(self, data, priority):
        self.runtime.call("reprioritize", data.draw(st.sampled_from(sorted(self.runtime.tickets) + [10_000])), priority)

    @rule(models=st.none() | st.sets(st.sampled_from(MODELS)))
    def unload(self, models):
        self.runtime.call("unload", models)

    @precondition(lambda self: len(self.runtime.tickets) > 20)
    @rule()
    def shutdown(self):
        self.runtime.call("shutdown")

    @invariant()
    def concurrency_limits_hold(self):
        admitted = Counter(
            t.model for t in self.runtime.tickets.values() if t.id not in self.runtime.ended
        )
        for model, count in admitted.items():
            assert count <= LIMITS[model], f"{count} requests admitted for {model}, limit {LIMITS[model]}"

    @invariant()
    def snapshot_matches(self):
        snapshot = self.scheduler.snapshot(self.runtime.now)
        assert set(snapshot.running_tickets) == set(self.runtime.running)
        assert snapshot.waiting == sum(snapshot.depth_by_band.values())

    def teardown(self):
        self.runtime.settle()
        assert set(self.runtime.ended) == set(self.runtime.tickets), "some requests never ended"
        assert self.scheduler.snapshot(self.runtime.now).waiting == 0


FifoMachine.TestCase.settings = hypothesis_settings(max_examples=300, stateful_step_count=60, deadline=None)
test_fifo_scheduler_properties = FifoMachine.TestCase
