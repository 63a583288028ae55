"""The fault runs' checker judged on hand-made histories: a clean one passes, and each kind of
broken promise planted in it is reported under its invariant, naming the request."""

from __future__ import annotations

import dataclasses

import pytest

from tests.faults.checker import check
from tests.faults.history import Answer, Fault, History, ModelEvent, Row

T = 1_000_000.0  # an arbitrary epoch second


def clean() -> History:
    """Two requests on one front end: `a` (priority 5) then `b` (priority 0), both served whole."""
    answers = [
        Answer("a", "127.1.0.1", "fe1", 5, False, 4, sent_at=T, status=200, ticket=1,
               first_byte_at=T + 1.0, ended_at=T + 1.1, tokens_got=4, complete=True),
        Answer("b", "127.1.0.2", "fe1", 0, True, 4, sent_at=T + 0.1, status=200, ticket=2,
               first_byte_at=T + 1.2, ended_at=T + 1.5, tokens_got=4, complete=True),
    ]
    rows = [Row(1, "127.1.0.1", "completed", 200, 4, 5, T + 0.01, T + 0.9),
            Row(2, "127.1.0.2", "completed", 200, 4, 0, T + 0.11, T + 1.15)]
    events = [ModelEvent("start", "a", T + 0.95), ModelEvent("end", "a", T + 1.05),
              ModelEvent("start", "b", T + 1.2), ModelEvent("end", "b", T + 1.5)]
    return History(answers, [], events, rows, byte_path_processes=frozenset({"worker"}))


def replaced(history: History, **changes) -> History:
    return dataclasses.replace(history, **changes)


def invariants(history: History) -> list[tuple[str, str]]:
    return [(v.invariant, v.request) for v in check(history)]


def test_a_clean_history_passes():
    assert check(clean()) == []


def test_a_request_answered_without_a_row_is_reported():
    history = clean()
    assert invariants(replaced(history, rows=history.rows[1:])) == [("row", "a")]


def test_only_a_refusal_for_want_of_a_row_may_have_none():
    history = clean()
    refused = dataclasses.replace(history.answers[0], status=503, ticket=None, complete=False, tokens_got=0,
                                  error='{"error": {"code": "request_history_unreachable"}}')
    unreachable = dataclasses.replace(refused, error='{"error": {"code": "scheduler_unreachable"}}')
    rest = {"rows": history.rows[1:], "events": history.events[2:]}  # `a` never reached the model
    assert invariants(replaced(history, answers=[refused, *history.answers[1:]], **rest)) == []
    assert invariants(replaced(history, answers=[unreachable, *history.answers[1:]], **rest)) == [("row", "a")]


def test_a_row_that_disagrees_with_the_answer_is_reported():
    history = clean()
    short = dataclasses.replace(history.rows[0], output_tokens=3)
    interrupted = dataclasses.replace(history.rows[1], state="interrupted", status_code=None, output_tokens=None)
    assert invariants(replaced(history, rows=[short, interrupted])) == [("row", "a"), ("row", "b")]


def test_an_error_answer_recorded_as_completed_is_reported():
    history = clean()
    history.answers[0] = dataclasses.replace(history.answers[0], status=503, complete=False, tokens_got=0)
    history.events = history.events[2:]
    assert invariants(history) == [("row", "a")]


def test_a_request_with_two_rows_and_a_stuck_row_are_reported():
    history = clean()
    twice = Row(3, "127.1.0.2", "dispatched", None, None, 0, T + 0.2, T + 0.3)
    assert invariants(replaced(history, rows=history.rows + [twice])) == [("stuck row", "row 3"), ("two rows", "b")]


def test_a_request_started_twice_is_reported_unless_a_worker_died_between():
    history = clean()
    again = history.events + [ModelEvent("start", "a", T + 3.0)]
    assert invariants(replaced(history, events=again)) == [("ran twice", "a")]
    killed = [Fault("kill", "worker", "process", T + 2.0, T + 2.5)]
    assert invariants(replaced(history, events=again, faults=killed)) == []


def test_a_model_started_for_a_client_already_gone_is_reported():
    history = clean()
    history.answers[1] = dataclasses.replace(history.answers[1], left_at=T + 0.5, status=None, complete=False,
                                             tokens_got=0, first_byte_at=None, ended_at=T + 0.5)
    history.rows[1] = dataclasses.replace(history.rows[1], state="cancelled", status_code=None, output_tokens=None)
    history.events = history.events[:2] + [ModelEvent("start", "b", T + 2.5)]
    assert invariants(history) == [("started for a gone client", "b")]
    # A Redis stall on its front end's path while the service learns it left excuses it.
    history.faults = [Fault("stall", "fe1", "redis", T + 0.4, T + 1.0)]
    assert invariants(history) == []


def test_a_stream_cut_by_a_redis_fault_is_reported_and_one_cut_by_its_front_end_dying_is_not():
    history = clean()
    history.answers[1] = dataclasses.replace(history.answers[1], complete=False, tokens_got=2,
                                             error="upstream_failed")
    history.rows[1] = dataclasses.replace(history.rows[1], state="failed", status_code=502, output_tokens=2)
    history.faults = [Fault("cut", "fe1", "redis", T + 1.25, T + 4.0)]
    found = check(history)
    assert [(v.invariant, v.request) for v in found] == [("cut off its byte path", "b")]
    assert "cut fe1 redis" in found[0].detail
    history.faults = [Fault("kill", "fe1", "process", T + 1.3, T + 3.0)]
    assert check(history) == []


def test_a_dispatch_out_of_priority_order_in_quiet_times_is_reported():
    history = clean()
    # b (priority 0) arrived after a (priority 5) but was dispatched first.
    history.rows = [dataclasses.replace(history.rows[0], dispatched_at=T + 1.3),
                    dataclasses.replace(history.rows[1], dispatched_at=T + 0.9)]
    assert invariants(history) == [("priority order", "a")]
    # The same while PostgreSQL was slowed for some process: not judged.
    history.faults = [Fault("delay", "worker", "postgres", T + 0.5, T + 0.7)]
    assert invariants(history) == []


@pytest.mark.parametrize("state", ["cancelled", "completed"])
def test_a_client_that_left_mid_stream_may_have_either_ending(state):
    history = clean()
    history.answers[1] = dataclasses.replace(history.answers[1], complete=False, tokens_got=2, left_at=T + 1.3)
    history.rows[1] = dataclasses.replace(history.rows[1], state=state)
    assert check(history) == []
