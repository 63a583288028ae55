"""500 concurrent clients across bands and models: each is served exactly once, in score order, with a row."""

from __future__ import annotations

import asyncio

import pytest

from scheduling.core import band_of
from tests.reliability.serial_load import load_config, nothing_lost, plan_requests, run_load
from tests.reliability.support import all_rows_terminal
from tests.served import Served

pytestmark = pytest.mark.e2e

CLIENTS = 500


def test_concurrent_clients_are_each_served_once_in_priority_then_arrival_order(tmp_path):
    events = tmp_path / "events.jsonl"
    planned = plan_requests(CLIENTS)
    assert {p.model for p in planned} == {"alpha", "beta", "gamma"}
    assert {band_of(p.priority).value for p in planned} == {"interactive", "normal", "batch"}

    with Served(tmp_path, load_config(events)) as served:
        run = asyncio.run(run_load(served, planned))
        rows = all_rows_terminal(served.data_dir, CLIENTS + 1)
        service_log = served.log()

    problems = nothing_lost(planned, run, events, rows, service_log)
    assert not problems, "\n".join(problems)
