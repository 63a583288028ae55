"""Random interleavings against the fifo scheduler: no request lost or duplicated, a request is
admitted exactly when its model is under its current concurrency limit, no model granted while a
start that evicts it runs, and config reloads never let a replaced process serve."""

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from scheduling.core import FifoScheduler, ModelSpec, Refuse, SerialSettings, SwapGroup

from .harness import policy_within
from .runtime_double import RuntimeDouble
from .search_effort import property_settings

MODELS = ("a", "b", "c", "d", "e")  # "e" is only configured by a reload
POLICIES = {
    "one at a time": [],
    "a+b share the GPU": [SwapGroup("ab", ("a", "b"), swap=False)],
    "c and d beside the rest": [SwapGroup("c", ("c",), exclusive=False), SwapGroup("d", ("d",), exclusive=False)],
    "exclusive a, non-exclusive c": [SwapGroup("a", ("a",)), SwapGroup("c", ("c",), exclusive=False)],
    "persistent d": [SwapGroup("d", ("d",), persistent=True)],
}
LIMITS = {"a": 2, "b": 3, "c": 1, "d": 10, "e": 2}


class FifoMachine(RuleBasedStateMachine):
    @initialize(policy=st.sampled_from(sorted(POLICIES)), ttl=st.sampled_from([0, 5]))
    def start(self, policy, ttl):
        models = {
            m: ModelSpec(m, ttl=ttl if m in "ab" else 0, concurrency_limit=LIMITS[m], fifo_priority=i * 5)
            for i, m in enumerate(MODELS[:4])
        }
        self.policy = policy
        self.models = models
        self.shut_down = False
        self.scheduler = FifoScheduler(models, policy_within(POLICIES[policy], models), SerialSettings())
        self.runtime = RuntimeDouble(self.scheduler)

    @rule(model=st.sampled_from(MODELS), priority=st.sampled_from([-100, 0, 3, 100]))
    def submit(self, model, priority):
        admitted = sum(t.model == model and t.id not in self.runtime.ended for t in self.runtime.tickets.values())
        ticket = self.runtime.new_ticket(model, priority)
        effects = self.runtime.call("submit", ticket)
        refused = [e.status for e in effects if isinstance(e, Refuse) and e.ticket_id == ticket.id]
        if model in self.models and not self.shut_down:
            limit = self.models[model].concurrency_limit
            expected = [429] if admitted >= limit else []
            assert refused == expected, f"{admitted} admitted for {model}, limit {limit}, refused {refused}"

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
            self.runtime.crash(data.draw(st.sampled_from(loaded)))

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
        self.shut_down = True
        self.runtime.call("shutdown")

    @rule(
        configured=st.sets(st.sampled_from(MODELS)),
        restart=st.sets(st.sampled_from(MODELS)),
        limits=st.lists(st.sampled_from([1, 2, 3]), min_size=len(MODELS), max_size=len(MODELS)),
        priorities=st.lists(st.sampled_from([-5, 0, 5]), min_size=len(MODELS), max_size=len(MODELS)),
        ttl=st.sampled_from([0, 5]),
    )
    def reconfigure(self, configured, restart, limits, priorities, ttl):
        models = {
            m: ModelSpec(m, ttl=ttl, concurrency_limit=limit, fifo_priority=priority)
            for m, limit, priority in zip(MODELS, limits, priorities)
            if m in configured
        }
        removed = self.models.keys() - models.keys()
        before = [t.id for t, _ in self.scheduler.ranked(self.runtime.now)]
        effects = self.runtime.reconfigure(models, policy_within(POLICIES[self.policy], models), restart)
        if self.shut_down:
            return
        self.models = models
        refused = {e.ticket_id: e for e in effects if isinstance(e, Refuse)}
        assert all((e.status, e.code) == (404, "model_removed") for e in refused.values())
        assert {self.runtime.tickets[ticket_id].model for ticket_id in refused} <= removed
        assert not any(t.model in removed for t, _ in self.scheduler.ranked(self.runtime.now))
        after = [t.id for t, _ in self.scheduler.ranked(self.runtime.now)]
        assert [t for t in after if t in before] == [t for t in before if t in after], "a reload reordered the queue"

    @invariant()
    def snapshot_matches(self):
        snapshot = self.scheduler.snapshot(self.runtime.now)
        assert set(snapshot.running_tickets) == set(self.runtime.running)
        assert snapshot.waiting == sum(snapshot.depth_by_band.values())

    def teardown(self):
        self.runtime.settle()
        assert set(self.runtime.ended) == set(self.runtime.tickets), "some requests never ended"
        snapshot = self.scheduler.snapshot(self.runtime.now)
        assert snapshot.waiting == 0
        assert set(snapshot.loaded) <= self.models.keys(), "a removed model was never stopped"
        assert not set(snapshot.loaded) & self.runtime.superseded, "a replaced process was never stopped"



FifoMachine.TestCase.settings = property_settings(300, stateful_step_count=60)
test_fifo_scheduler_properties = FifoMachine.TestCase
