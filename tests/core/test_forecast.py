"""The forecast of when each waiting request goes: checked against the scheduler actually played out.

When every job and load takes exactly its typical time, the forecast must be exact: same order, same
times, whatever the mix of priorities, models, slots, swaps and aging crossovers. Requests expected to
keep arriving at random must lengthen a wait by what they bring on average. With no history it must
say so rather than guess.
"""

from __future__ import annotations

import heapq
import itertools
import random
import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduling.core import Grant, SerialScheduler, SerialSettings, StartModel, StopModel, SwapGroup, SwapPolicy
from scheduling.core.durations import DurationHistory, JobKind
from scheduling.core.forecast import Arrivals, Underway, forecast

from .harness import Tickets, grant_of, specs, starts

MODELS = ("chat", "coder", "embed")
GROUPS = [
    SwapGroup("gpu", ("chat", "coder")),
    SwapGroup("embeddings", ("embed",), swap=False, exclusive=False, persistent=True),
]
JOB_S = {"chat": 10.0, "coder": 4.0, "embed": 1.0}
LOAD_S = {"chat": 6.0, "coder": 3.0, "embed": 2.0}


def kind(model: str) -> JobKind:
    return JobKind(model, "chat", False, "normal")


def urgent(model: str) -> JobKind:
    """An interactive request's kind: with no history of its own, it borrows its model's jobs' length."""
    return JobKind(model, "chat", False, "interactive")


def history(jobs=JOB_S, loads=LOAD_S) -> DurationHistory:
    durations = DurationHistory()
    for model, seconds in jobs.items():
        durations.add_job(kind(model), seconds)
    for model, seconds in loads.items():
        durations.add_load(model, seconds)
    return durations


def scheduler_with(slots=None, aging_divisor=60.0) -> SerialScheduler:
    settings_ = SerialSettings(aging_divisor=aging_divisor, swap_affinity_bonus=10, slots=slots or {})
    return SerialScheduler(specs(*MODELS), SwapPolicy(GROUPS, MODELS), settings_)


class World:
    """The scheduler driven the way the runtime drives it, every job and load taking its typical time:
    what really happens, to hold the forecast against."""

    def __init__(self, scheduler: SerialScheduler, ticket: Tickets | None = None) -> None:
        self.scheduler = scheduler
        self.ticket = ticket
        self.events: list = []
        self.order = itertools.count()
        self.jobs: dict[int, float] = {}  # running: ticket -> granted at
        self.starts: dict[str, float] = {}
        self.model_of: dict[int, str] = {}
        self.granted_at: dict[int, float] = {}

    def apply(self, effects, now: float) -> None:
        for effect in effects:
            if isinstance(effect, Grant):
                self.jobs[effect.ticket_id] = now
                self.granted_at[effect.ticket_id] = now
                self.model_of[effect.ticket_id] = effect.model
                heapq.heappush(self.events, (now + JOB_S[effect.model], next(self.order), "end", effect.ticket_id))
            elif isinstance(effect, StartModel):
                self.starts[effect.model] = now
                heapq.heappush(self.events, (now + LOAD_S[effect.model], next(self.order), "ready", effect.model))
            elif isinstance(effect, StopModel):
                heapq.heappush(self.events, (now, next(self.order), "stopped", effect.model))

    def run_until(self, until: float) -> None:
        while self.events and self.events[0][0] <= until:
            self.step()

    def keep_arriving(self, model: str, priority: int, every: float, after: float, rng: random.Random) -> None:
        """Requests for `model` at `priority` from `after` on, at random (Poisson), one every `every`
        seconds on average."""
        at = after + rng.expovariate(1 / every)
        heapq.heappush(self.events, (at, next(self.order), "arrive", (model, priority, every, rng)))

    def step(self) -> None:
        at, _, event, subject = heapq.heappop(self.events)
        if event == "arrive":
            model, priority, every, rng = subject
            arrived = self.ticket(model, priority, at)
            self.model_of[arrived.id] = model
            self.keep_arriving(model, priority, every, at, rng)
            self.apply(self.scheduler.submit(arrived, at), at)
        elif event == "end":
            del self.jobs[subject]
            self.apply(self.scheduler.finished(subject, at), at)
        elif event == "ready":
            del self.starts[subject]
            self.apply(self.scheduler.model_ready(subject, at), at)
        else:
            self.apply(self.scheduler.model_stopped(subject, at), at)

    def forecast(self, waiting, now: float, durations=None, expected=()):
        kinds = {tid: kind(model) for tid, model in {**self.model_of, **waiting}.items()}
        underway = Underway(jobs=dict(self.jobs), starts=dict(self.starts))
        ranked = [t.id for t, _ in self.scheduler.ranked(now)]
        launching = [tid for tid in waiting if tid not in ranked]
        return forecast(self.scheduler, underway, kinds, [*launching, *ranked], durations or history(), now, expected)


def test_an_interactive_request_behind_a_batch_job_waits_for_what_is_left_of_it():
    scheduler, ticket = scheduler_with(), Tickets()
    world = World(scheduler)
    batch = ticket("chat", -100, 0.0)
    world.apply(scheduler.submit(batch, 0.0), 0.0)
    world.run_until(6.0)  # chat loaded at 6 s, the batch job runs until 16 s
    chat = ticket("chat", 100, 9.0)
    world.apply(scheduler.submit(chat, 9.0), 9.0)
    outlook = world.forecast({chat.id: "chat"}, 9.0)[chat.id]
    assert (outlook.position, outlook.eta_s, outlook.load_s) == (1, 7.0, None)
    assert outlook.after.kind == "job" and outlook.after.ticket_id == batch.id and outlook.after.in_s == 7.0


def test_a_request_for_the_other_model_waits_for_the_job_then_for_its_load():
    scheduler, ticket = scheduler_with(), Tickets()
    world = World(scheduler)
    world.apply(scheduler.submit(ticket("chat", -100, 0.0), 0.0), 0.0)
    world.run_until(6.0)
    coder = ticket("coder", 100, 8.0)
    world.apply(scheduler.submit(coder, 8.0), 8.0)
    outlook = world.forecast({coder.id: "coder"}, 8.0)[coder.id]
    assert outlook.eta_s == pytest.approx(8.0 + 3.0) and outlook.load_s == pytest.approx(3.0)
    assert outlook.after.kind == "job" and outlook.after.model == "chat"


def test_a_request_for_a_model_that_coexists_waits_only_for_its_load():
    scheduler, ticket = scheduler_with(), Tickets()
    world = World(scheduler)
    world.apply(scheduler.submit(ticket("chat", -100, 0.0), 0.0), 0.0)
    world.run_until(6.0)
    embed = ticket("embed", 0, 7.0)
    world.apply(scheduler.submit(embed, 7.0), 7.0)  # starts at once beside the chat job
    outlook = world.forecast({embed.id: "embed"}, 7.0)[embed.id]
    assert outlook.position is None and outlook.eta_s == pytest.approx(2.0) and outlook.load_s is None


def test_without_history_the_forecast_says_so_instead_of_guessing():
    scheduler, ticket = scheduler_with(), Tickets()
    world = World(scheduler)
    world.apply(scheduler.submit(ticket("chat", -100, 0.0), 0.0), 0.0)
    world.run_until(6.0)
    waiting = ticket("chat", 0, 7.0)
    world.apply(scheduler.submit(waiting, 7.0), 7.0)
    outlook = world.forecast({waiting.id: "chat"}, 7.0, durations=history(jobs={}))[waiting.id]
    assert outlook.eta_s is None and outlook.position == 1
    assert "no history yet" in outlook.unknown and "chat" in outlook.unknown


def test_a_job_past_its_typical_time_is_expected_to_overrun_by_as_much_again():
    scheduler, ticket = scheduler_with(), Tickets()
    world = World(scheduler)
    world.apply(scheduler.submit(ticket("chat", -100, 0.0), 0.0), 0.0)
    world.run_until(6.0)
    late = ticket("chat", 0, 30.0)  # the 10 s job has run 24 s
    scheduler.submit(late, 30.0)
    assert world.forecast({late.id: "chat"}, 30.0)[late.id].eta_s == pytest.approx(14.0)


def test_the_forecast_leaves_the_scheduler_untouched():
    scheduler, ticket = scheduler_with(), Tickets()
    world = World(scheduler)
    world.apply(scheduler.submit(ticket("chat", -100, 0.0), 0.0), 0.0)
    world.run_until(6.0)
    waiting = [ticket(m, 0, 7.0) for m in ("coder", "chat", "embed")]
    for t in waiting:
        world.apply(scheduler.submit(t, 7.0), 7.0)
    before = scheduler.snapshot(7.0), [t.id for t, _ in scheduler.ranked(7.0)]
    world.forecast({t.id: t.model for t in waiting}, 7.0)
    assert (scheduler.snapshot(7.0), [t.id for t, _ in scheduler.ranked(7.0)]) == before


requests = st.lists(
    st.tuples(st.sampled_from(MODELS), st.sampled_from([-100, 0, 100]), st.floats(0, 300)),
    min_size=1, max_size=12,
)


@settings(max_examples=150, deadline=None)
@given(
    requests=requests,
    slots=st.sampled_from([{}, {"chat": 2}, {"embed": 3, "coder": 2}]),
    aging=st.sampled_from([5.0, 60.0]),
    running=st.sampled_from(MODELS),
)
def test_with_typical_durations_the_forecast_is_exactly_what_happens(requests, slots, aging, running):
    """Requests arrived over the last five minutes (so aging crossovers happen while they wait) queue
    behind a running job; the forecast made now gives every one of them its real dispatch time and
    its real place in the dispatch order."""
    scheduler, ticket = scheduler_with(slots, aging), Tickets()
    world = World(scheduler)
    world.apply(scheduler.submit(ticket(running, -100, 0.0), 0.0), 0.0)
    world.run_until(LOAD_S[running])
    now = LOAD_S[running] + 0.5
    waiting = {}
    for model, priority, ago in requests:
        t = ticket(model, priority, now - ago)
        waiting[t.id] = model
        world.apply(scheduler.submit(t, now), now)
    pending = {tid: m for tid, m in waiting.items() if tid not in world.granted_at}
    outlooks = world.forecast(pending, now)
    while world.events:
        world.step()
    assert {tid: outlooks[tid].eta_s for tid in pending} == pytest.approx(
        {tid: world.granted_at[tid] - now for tid in pending}
    )
    queued_order = sorted(
        (tid for tid in pending if outlooks[tid].position is not None), key=lambda tid: outlooks[tid].position
    )
    assert queued_order == sorted(queued_order, key=lambda tid: (world.granted_at[tid], list(world.granted_at).index(tid)))


def test_the_jobs_the_copy_plays_in_a_row_add_up_toward_their_mean():
    """The first job ahead is told by its kind's median, the n-th played after it by median + (mean −
    median)(1 − 1/n) (see `DurationHistory.job_s`): waits far back are sums of many jobs."""
    scheduler, ticket = scheduler_with(), Tickets()
    world = World(scheduler)
    world.apply(scheduler.submit(ticket("chat", 0, 0.0), 0.0), 0.0)
    world.run_until(6.0)  # chat is up and its job began at 6 s
    queued = [ticket("chat", 0, 7.0) for _ in range(3)]
    for t in queued:
        world.apply(scheduler.submit(t, 7.0), 7.0)
    skewed = history(jobs={})
    for seconds in (2, 2, 2, 2, 12):  # median 2, mean 4
        skewed.add_job(kind("chat"), seconds)
    outlooks = world.forecast({t.id: "chat" for t in queued}, 7.0, durations=skewed)
    # The running job has 1 s left (the median of those longer than its 1 s so far, less that second);
    # then the first queued job is told 2 s, the second 2 + 2 × (1 − 1/2) = 3 s.
    assert [outlooks[t.id].eta_s for t in queued] == pytest.approx([1.0, 3.0, 6.0])


def test_a_model_with_a_start_under_way_counts_its_load_from_when_it_began():
    scheduler, ticket = scheduler_with(), Tickets()
    world = World(scheduler)
    first = ticket("chat", 0, 0.0)
    assert starts(scheduler.submit(first, 0.0))
    world.starts["chat"] = 0.0
    outlook = forecast(scheduler, Underway(jobs={}, starts={"chat": 0.0}), {first.id: kind("chat")},
                       [first.id], history(), 4.0)[first.id]
    assert outlook.eta_s == pytest.approx(2.0) and outlook.position is None
    assert grant_of(scheduler.model_ready("chat", 6.0)).ticket_id == first.id


def test_a_batch_request_is_expected_to_wait_for_the_more_urgent_ones_that_will_come():
    scheduler, ticket = scheduler_with(), Tickets()
    world = World(scheduler)
    world.apply(scheduler.submit(ticket("chat", 0, 0.0), 0.0), 0.0)
    world.run_until(6.0)  # the job runs until 16 s
    normal, batch = ticket("chat", 0, 7.0), ticket("chat", -100, 7.0)
    for waiting in (normal, batch):
        world.apply(scheduler.submit(waiting, 7.0), 7.0)
    queued = {normal.id: "chat", batch.id: "chat"}
    alone = world.forecast(queued, 7.0)
    assert alone[batch.id].eta_s == pytest.approx(19.0)  # after the running job and the normal one
    # One 10 s interactive job every 40 s on average takes a quarter of the GPU: 19 s of work stretch to 19 / 0.75.
    busy = world.forecast(queued, 7.0, expected=[Arrivals(urgent("chat"), 100, 40.0)])
    assert busy[batch.id].eta_s == pytest.approx(19.0 / 0.75) and busy[normal.id].eta_s == pytest.approx(9.0 / 0.75)
    assert busy[batch.id].after.expected and busy[batch.id].after.band == "interactive"
    # Later requests of a request's own priority go after it: they do not lengthen its wait.
    same = world.forecast(queued, 7.0, expected=[Arrivals(kind("chat"), 0, 40.0)])
    assert same[normal.id] == alone[normal.id] and same[batch.id].eta_s == pytest.approx(19.0 / 0.75)
    flooded = world.forecast(queued, 7.0, expected=[Arrivals(urgent("chat"), 100, 5.0)])[batch.id]
    assert flooded.eta_s is None and "faster than they can be served" in flooded.unknown


@pytest.mark.parametrize("model, every", [("chat", 40.0), ("coder", 10.0)])
def test_the_wait_foreseen_is_the_average_over_many_random_futures(model, every):
    """The same queue played out 400 times, more urgent requests arriving at random at the pace the
    forecast was told: the waits it predicted are the average waits of those futures (within 6 %;
    the seeds are fixed, so this is the same check each run)."""
    now = LOAD_S[model] + 1.0

    def queue_behind_a_running_job():
        scheduler, ticket = scheduler_with(), Tickets()
        world = World(scheduler, ticket)
        world.apply(scheduler.submit(ticket(model, 0, 0.0), 0.0), 0.0)
        world.run_until(now)
        queued = {}
        for priority in (0, -100, -100):
            t = ticket(model, priority, now)
            queued[t.id] = model
            world.apply(scheduler.submit(t, now), now)
        return world, queued

    world, queued = queue_behind_a_running_job()
    outlooks = world.forecast(queued, now, expected=[Arrivals(urgent(model), 100, every)])
    waits: dict[int, list[float]] = {tid: [] for tid in queued}
    for seed in range(400):
        world, queued = queue_behind_a_running_job()
        world.keep_arriving(model, 100, every, now, random.Random(seed))
        while not queued.keys() <= world.granted_at.keys():
            world.step()
        for tid in queued:
            waits[tid].append(world.granted_at[tid] - now)
    for tid in queued:
        assert outlooks[tid].eta_s == pytest.approx(statistics.mean(waits[tid]), rel=0.06)


def test_the_pace_expected_is_each_kinds_recent_one_once_three_came_over_ten_seconds():
    from scheduling.core.forecast import RecentArrivals

    recent = RecentArrivals()
    for at in (0.0, 4.0, 8.0):
        recent.add(at, kind("chat"), 100)
    recent.add(5.0, kind("coder"), 0)  # one alone is no pace
    assert recent.expected(9.0) == []  # under ten seconds: a burst, not a pace
    assert recent.expected(12.0) == [Arrivals(kind("chat"), 100, 4.0)]
    assert recent.expected(700.0) == []  # all older than the window


def test_the_same_state_gets_the_same_forecast_however_often_it_is_asked():
    """A waiting caller polls its ETA: asked twice of one state, or of a copy of it, the forecast must
    not move (the copy is played, never the scheduler itself, and nothing in it is drawn at random)."""
    import copy

    scheduler, ticket = scheduler_with({"chat": 2}), Tickets()
    world = World(scheduler)
    world.apply(scheduler.submit(ticket("chat", 0, 0.0), 0.0), 0.0)
    world.run_until(6.0)
    queued = {}
    for model, priority in (("coder", -100), ("chat", 0), ("chat", -100), ("embed", 100), ("coder", 100)):
        t = ticket(model, priority, 7.0)
        queued[t.id] = model
        world.apply(scheduler.submit(t, 7.0), 7.0)
    pending = {tid: m for tid, m in queued.items() if tid not in world.granted_at}
    expected = [Arrivals(kind("chat"), 100, 30.0), Arrivals(kind("coder"), 0, 40.0)]
    first = world.forecast(pending, 7.0, expected=expected)
    assert world.forecast(pending, 7.0, expected=expected) == first
    world.scheduler = copy.deepcopy(scheduler)
    assert world.forecast(pending, 7.0, expected=expected) == first
    assert all(outlook.eta_s is not None for outlook in first.values())
