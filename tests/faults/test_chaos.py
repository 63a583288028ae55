"""The fault tier: the real service under a seeded nemesis (relay cuts, stalls, slowdowns and
partitions per process, kill -9 of any process), judged by `tests.faults.checker`. A short run of
each topology is part of `make test`; `make chaos SECONDS=N SEED=S` runs long ones. A failure
lists every broken promise by invariant and request, with the seed that reproduces the run."""

from __future__ import annotations

import pytest

from tests.faults.nemesis import Planned
from tests.faults.run import fault_run

pytestmark = pytest.mark.e2e


def judge(outcome, topology: str, seed: int) -> None:
    report = outcome.report(topology, seed)
    print(report)
    assert not outcome.violations and not outcome.problems, report


def test_one_process_on_postgresql_keeps_every_promise_under_faults(tmp_path, postgres, chaos):
    seconds, seed, count = chaos
    url, _ = postgres
    outcome = fault_run(tmp_path, "single", url, None, seed=seed, seconds=seconds, count=count)
    judge(outcome, "single", seed)


def test_front_ends_and_workers_keep_every_promise_under_faults(tmp_path, postgres, redis_url, chaos):
    seconds, seed, count = chaos
    url, _ = postgres
    outcome = fault_run(tmp_path, "distributed", url, redis_url, seed=seed, seconds=seconds, count=count)
    judge(outcome, "distributed", seed)


def test_postgresql_away_for_everyone_for_12_s_under_front_ends_and_workers(tmp_path, postgres, redis_url):
    """The database server itself goes away while requests are served and queued: every process
    loses it at once, the workers' instance locks included. The active worker takes its lock again
    and the standby stands by again: neither exits."""
    url, _ = postgres
    outage = [Planned(at=3.0, kind="cut", target="everyone", path="postgres", seconds=12.0, pick=0.0)]
    outcome = fault_run(tmp_path, "distributed", url, redis_url, seed=12, seconds=20, count=50, faults=outage)
    judge(outcome, "distributed", 12)
    exited = [fault.process for fault in outcome.history.faults if fault.kind == "kill"]
    assert not exited, f"{exited} exited over the outage (the active worker and the standby should both outlast it)"
