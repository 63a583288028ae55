"""Random interleavings around a model with a TTL, under both schedulers: it is unloaded exactly when it
has been idle — up, serving nothing, nothing queued for it — for its TTL, measured from the moment it
last became idle (checked against the test's own account of the model, not the scheduler's)."""

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from scheduling.core import FifoScheduler, SerialScheduler, SerialSettings, StopModel, SwapGroup, SwapPolicy

from .harness import specs
from .runtime_double import RuntimeDouble
from .search_effort import property_settings

TTL = 5.0
SCHEDULERS = {
    # serial runs one job at a time, so a request for the loaded, idle "a" waits while "b" serves.
    "serial": lambda: SerialScheduler(
        specs("a", "b", a={"ttl": TTL}),
        SwapPolicy([SwapGroup("ab", ("a", "b"), swap=False)], ("a", "b")),
        SerialSettings(aging_divisor=60, swap_affinity_bonus=0),
    ),
    # fifo: "b" starts beside "a", but a request for "a" must evict "b", so it waits while "b" serves.
    "fifo": lambda: FifoScheduler(
        specs("a", "b", a={"ttl": TTL}),
        SwapPolicy([SwapGroup("a", ("a",)), SwapGroup("b", ("b",), exclusive=False)], ("a", "b")),
        SerialSettings(),
    ),
}


class TtlMachine(RuleBasedStateMachine):
    @initialize(name=st.sampled_from(sorted(SCHEDULERS)))
    def start(self, name):
        self.scheduler = SCHEDULERS[name]()
        self.runtime = RuntimeDouble(self.scheduler)
        self.idle_since: float | None = None  # when "a" last became idle, by this test's account

    def a_is_idle(self) -> bool:
        runtime = self.runtime
        up = "a" in runtime.up and "a" not in runtime.stops and "a" not in runtime.starts
        wanted = any(t.model == "a" and t.id not in runtime.ended for t in runtime.tickets.values())
        return up and not wanted

    def step(self, method, *args):
        effects = getattr(self.runtime, method)(*args)
        if not self.a_is_idle():
            self.idle_since = None
        elif self.idle_since is None:
            self.idle_since = self.runtime.now
        return effects

    @rule(model=st.sampled_from(["a", "b"]))
    def submit(self, model):
        self.step("call", "submit", self.runtime.new_ticket(model, 0))

    @precondition(lambda self: self.runtime.running)
    @rule(data=st.data())
    def finish(self, data):
        self.step("finish", data.draw(st.sampled_from(sorted(self.runtime.running))))

    @precondition(lambda self: self.runtime.tickets)
    @rule(data=st.data())
    def cancel(self, data):
        self.step("cancel", data.draw(st.sampled_from(sorted(self.runtime.tickets))))

    @precondition(lambda self: self.runtime.starts)
    @rule(data=st.data())
    def start_done(self, data):
        self.step("answer_start", data.draw(st.sampled_from(sorted(self.runtime.starts))), True)

    @precondition(lambda self: self.runtime.stops)
    @rule(data=st.data())
    def stop_done(self, data):
        self.step("answer_stop", data.draw(st.sampled_from(sorted(self.runtime.stops))))

    @rule(seconds=st.sampled_from([0.5, 1.0, 3.0, TTL, 10.0]))
    def wait(self, seconds):
        self.runtime.now += seconds

    @rule()
    def tick(self):
        due = self.idle_since is not None and self.runtime.now >= self.idle_since + TTL
        effects = self.step("call", "tick")
        unloaded = StopModel("a", "ttl") in effects
        assert unloaded == due, f"a unloaded={unloaded}, but idle since {self.idle_since} at {self.runtime.now}"

    @invariant()
    def the_deadline_is_ttl_after_a_became_idle(self):
        if not hasattr(self, "scheduler"):
            return
        expected = None if self.idle_since is None else self.idle_since + TTL
        assert self.scheduler.next_deadline() == expected


TtlMachine.TestCase.settings = property_settings(300, stateful_step_count=40)
test_ttl_properties = TtlMachine.TestCase
