"""Typical durations: the median of the recent ones, by the kind of job, borrowing when a kind is new."""

from __future__ import annotations

import pytest

from scheduling.core.durations import DurationHistory, JobKind

CHAT = "/v1/chat/completions"


def test_each_band_has_its_own_typical_job_and_one_outlier_barely_moves_it():
    history = DurationHistory()
    for seconds in (10, 11, 12, 3600):
        history.add_job(JobKind("m", CHAT, False, "batch"), seconds)
    for seconds in (1, 2, 3):
        history.add_job(JobKind("m", CHAT, False, "interactive"), seconds)
    assert history.job_s(JobKind("m", CHAT, False, "batch")) == 11.5
    assert history.job_s(JobKind("m", CHAT, False, "interactive")) == 2


def test_the_nth_of_jobs_that_add_up_moves_from_the_median_toward_the_mean():
    """A sum of many skewed jobs comes near as many times their mean, one job alone near their median."""
    history = DurationHistory()
    for seconds in (2, 2, 2, 2, 12):  # median 2, mean 4
        history.add_job(JobKind("m", CHAT, False, "batch"), seconds)
    told = [history.job_s(JobKind("m", CHAT, False, "batch"), among) for among in (1, 2, 4)]
    assert told == [2, 3, 3.5]


def test_a_new_kind_borrows_from_the_closest_kinds_of_its_model_and_never_from_another_model():
    history = DurationHistory()
    history.add_job(JobKind("m", CHAT, True, "batch"), 30)
    history.add_job(JobKind("m", CHAT, False, "batch"), 10)
    history.add_job(JobKind("m", "/v1/embeddings", True, "normal"), 2)
    history.add_job(JobKind("m", "/v1/embeddings", True, "normal"), 4)
    assert history.job_s(JobKind("m", CHAT, True, "normal")) == 30  # same route and streaming first
    assert history.job_s(JobKind("m", "/v1/embeddings", False, "batch")) == 3  # then the same route
    assert history.job_s(JobKind("m", "/v1/rerank", False, "normal")) == 7  # then all of the model's jobs
    assert history.job_s(JobKind("other", CHAT, True, "normal")) is None


def test_only_the_most_recent_window_counts():
    history = DurationHistory(window=3)
    for seconds in (100, 100, 100, 1, 1, 1):
        history.add_job(JobKind("m", CHAT, False, "normal"), seconds)
    history.add_load("m", 5)
    assert history.job_s(JobKind("m", CHAT, False, "normal")) == 1
    assert history.load_s("m") == 5 and history.load_s("never") is None


def test_what_is_left_of_a_running_job_counts_only_the_jobs_that_lasted_longer():
    history = DurationHistory()
    for seconds in (2, 4, 6, 30, 40):
        history.add_job(JobKind("m", CHAT, False, "normal"), seconds)
    kind = JobKind("m", CHAT, False, "normal")
    assert history.job_left_s(kind, 0) == 6  # the typical job
    assert history.job_left_s(kind, 10) == 25  # it is one of the long ones: 30 or 40
    assert history.job_left_s(kind, 100) == 94  # longer than any: it overruns the typical 6 s as much again
    assert history.job_left_s(JobKind("new", CHAT, False, "normal"), 5) is None
    history.add_load("m", 8)
    assert history.load_left_s("m", 3) == 5 and history.load_left_s("m", 8.5) == pytest.approx(0.8)


def test_a_run_of_jobs_some_at_once_takes_as_many_rounds_of_the_typical_job():
    history = DurationHistory()
    kind = JobKind("m", CHAT, False, "batch")
    assert history.run_s(kind, 10, 2) is None  # no job of the model finished yet
    for seconds in (2.0, 2.0, 2.0):
        history.add_job(kind, seconds)
    assert history.run_s(kind, 10, 2) == 10.0  # five rounds of 2 s
    assert history.run_s(kind, 9, 2) == 10.0  # the last round has one job: it takes as long
    assert history.run_s(kind, 3, 1) == 6.0
    assert history.run_s(kind, 0, 1) == 0.0
