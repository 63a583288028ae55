"""Random interleavings against the serial scheduler: no request lost or duplicated, one job at a
time, every pick is the best-scoring waiting request (checked against a brute-force scorer, with
the loaded models taken from what the runtime double was told, not from the scheduler), an idle
GPU never leaves work waiting, and config reloads never let a replaced process serve."""

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from scheduling.core import (
    Dequeued,
    ModelSpec,
    Refuse,
    SerialScheduler,
    SerialSettings,
    StartModel,
    SwapGroup,
)

from .harness import policy_within
from .runtime_double import RuntimeDouble
from .runtime_rules import RuntimeAnswers
from .scoring import best_first
from .search_effort import property_settings

MODELS = ("a", "b", "c", "d")  # "d" is only configured by a reload
# One GPU, one model at a time: the spec's serial behaviour. Models that share the GPU are
# checked by test_serial_coexist_properties.
POLICIES = {
    "one at a time": [],
    "one swap group": [SwapGroup("all", MODELS)],
    "a swap group beside the ungrouped": [SwapGroup("ab", ("a", "b"))],
}
PRIORITIES = st.sampled_from([-100, -99, -98, -1, 0, 1, 2, 100, 101])
SETTINGS = st.builds(SerialSettings, st.sampled_from([0, 0.5, 1, 60]), st.sampled_from([0, 1, 10, 99]))


class SerialMachine(RuntimeAnswers, RuleBasedStateMachine):
    @initialize(policy=st.sampled_from(sorted(POLICIES)), settings=SETTINGS, ttl=st.sampled_from([0, 5, 60]))
    def start(self, policy, settings, ttl):
        models = {"a": ModelSpec("a", ttl=ttl), "b": ModelSpec("b"), "c": ModelSpec("c", ttl=1)}
        self.settings = settings
        self.policy = policy
        self.configured = set(models)
        self.scheduler = SerialScheduler(models, policy_within(POLICIES[policy], models), settings)
        self.runtime = RuntimeDouble(self.scheduler)

    def observe(self, method, *args, submitted=None):
        """Call the scheduler through the runtime double; if the call picked a request, check the
        pick against brute force over what was waiting."""
        now = self.runtime.now
        before = {t.id: t for t, _ in self.scheduler.ranked(now)}
        if submitted is not None:
            before[submitted.id] = submitted
        effects = getattr(self.runtime, method)(*args)
        after = {t.id for t, _ in self.scheduler.ranked(now)}
        removed = {e.ticket_id for e in effects if isinstance(e, (Refuse, Dequeued))}
        picked = set(before) - after - removed
        assert len(picked) <= 1, f"picked {picked} in one step"
        if picked:
            # The pick came before any StartModel of this step, while the models it evicts were up.
            evicted = {model for e in effects if isinstance(e, StartModel) for model in e.evict}
            loaded = self.runtime.ready_for_work() | (evicted - self.runtime.stops - self.runtime.superseded)
            waiting = [t for ticket_id, t in before.items() if ticket_id not in removed]
            best = best_first(waiting, now, loaded, self.settings)[0]
            assert picked == {best.id}, f"picked {picked}, but #{best.id} scored best"
        return effects

    @rule(model=st.sampled_from(MODELS), priority=PRIORITIES)
    def submit(self, model, priority):
        ticket = self.runtime.new_ticket(model, priority)
        self.observe("call", "submit", ticket, submitted=ticket)

    @rule(data=st.data())
    def cancel(self, data):
        self.observe("cancel", data.draw(st.sampled_from(sorted(self.runtime.tickets) + [10_000])))

    @rule(data=st.data())
    def finish_again_or_unknown(self, data):
        ticket_id = data.draw(st.sampled_from(sorted(self.runtime.ended) + [10_000]))
        assert self.runtime.finish(ticket_id) == []

    @rule(seconds=st.sampled_from([0.25, 1, 5, 60, 600, 6000]))
    def wait(self, seconds):
        self.runtime.now += seconds

    @rule()
    def tick(self):
        self.observe("call", "tick")
        deadline = self.scheduler.next_deadline()
        assert deadline is None or deadline > self.runtime.now

    @rule(settings=SETTINGS)
    def retune(self, settings):
        self.settings = settings
        self.observe("call", "retune", settings)

    @rule(data=st.data(), priority=PRIORITIES)
    def reprioritize(self, data, priority):
        ticket_id = data.draw(st.sampled_from(sorted(self.runtime.tickets) + [10_000]))
        self.observe("call", "reprioritize", ticket_id, priority)

    @rule(models=st.none() | st.sets(st.sampled_from(MODELS + ("unknown",))))
    def unload(self, models):
        self.observe("call", "unload", models)

    @precondition(lambda self: len(self.runtime.tickets) > 20)
    @rule()
    def shutdown(self):
        self.observe("call", "shutdown")

    @rule(
        configured=st.sets(st.sampled_from(MODELS)),
        restart=st.sets(st.sampled_from(MODELS)),
        ttls=st.lists(st.sampled_from([0, 1, 5, 60]), min_size=len(MODELS), max_size=len(MODELS)),
    )
    def reconfigure(self, configured, restart, ttls):
        models = {m: ModelSpec(m, ttl=ttl) for m, ttl in zip(MODELS, ttls) if m in configured}
        removed = self.configured - configured
        before = {t.id: t for t, _ in self.scheduler.ranked(self.runtime.now)}
        self.configured = configured
        effects = self.observe("reconfigure", models, policy_within(POLICIES[self.policy], models), restart)
        refused = {e.ticket_id: e for e in effects if isinstance(e, Refuse)}
        assert refused.keys() >= {t.id for t in before.values() if t.model in removed}
        assert all((e.status, e.code) == (404, "model_removed") for e in refused.values())
        assert {self.runtime.tickets[ticket_id].model for ticket_id in refused} <= removed
        after = {t.id: t for t, _ in self.scheduler.ranked(self.runtime.now)}
        answered = self.runtime.granted | self.runtime.ended.keys()
        kept = {i: t for i, t in before.items() if t.model in configured and i not in answered}
        assert all(after[i] == t for i, t in kept.items() if i in after), "a reload changed a waiting request"
        assert len(kept.keys() - after.keys()) <= 1, "only one request may leave the queue, to start its model"

    @invariant()
    def one_job_at_a_time(self):
        assert len(self.runtime.running) <= 1
        snapshot = self.scheduler.snapshot(self.runtime.now)
        assert set(snapshot.running_tickets) == set(self.runtime.running)
        assert snapshot.waiting == sum(snapshot.depth_by_band.values()) == len(self.scheduler.ranked(self.runtime.now))

    @invariant()
    def the_scheduler_knows_what_is_loaded(self):
        snapshot = self.scheduler.snapshot(self.runtime.now)
        assert set(snapshot.loaded) == self.runtime.up - self.runtime.stops, (
            f"scheduler says {sorted(snapshot.loaded)} are loaded; the starts, stops and crashes "
            f"it was told of say {sorted(self.runtime.up - self.runtime.stops)}"
        )

    @invariant()
    def an_idle_gpu_with_waiting_work_has_a_dispatch_or_start_under_way(self):
        runtime = self.runtime
        waiting = runtime.waiting()
        if runtime.running or not waiting or runtime.starts:
            return
        # Nothing runs and nothing starts: a stop must be under way, which wakes the scheduler when it
        # ends. The next request may be picked already, or still queued behind the model that stop's
        # cut-short start evicted; one at most.
        queued = {t.id for t, _ in self.scheduler.ranked(runtime.now)}
        picked = waiting - queued
        assert runtime.stops and len(picked) <= 1, (
            f"the GPU is idle with {sorted(waiting)} waiting, {sorted(picked)} picked, "
            f"and stops under way for {sorted(runtime.stops)}"
        )

    def teardown(self):
        self.runtime.settle()
        assert set(self.runtime.ended) == set(self.runtime.tickets), "some requests never ended"
        snapshot = self.scheduler.snapshot(self.runtime.now)
        assert snapshot.waiting == 0
        assert set(snapshot.loaded) <= self.configured, "a removed model was never stopped"
        assert not set(snapshot.loaded) & self.runtime.superseded, "a replaced process was never stopped"



SerialMachine.TestCase.settings = property_settings(300, stateful_step_count=60)
test_serial_scheduler_properties = SerialMachine.TestCase
