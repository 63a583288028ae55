"""`llamaswap replay` on traffic the real service recorded: the settings in force reproduce the recorded
dispatch order, and a proposed setting changes what the replay reports."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.e2e.test_data_path import _post_in_thread, gpu_held
from tests.reliability.support import all_rows_terminal
from tests.served import REPO, Served, fake_cmd, wait_until

pytestmark = pytest.mark.e2e


@pytest.fixture
def served(tmp_path):
    text = f"""
        healthCheckTimeout: 20
        models:
          alpha:
            cmd: {fake_cmd("alpha", None, "--tps", "200", "--load-delay", "0.3")}
            proxy: http://127.0.0.1:${{PORT}}
          beta:
            cmd: {fake_cmd("beta", None, "--tps", "200", "--load-delay", "0.3")}
            proxy: http://127.0.0.1:${{PORT}}
        routing:
          scheduler:
            use: serial
            settings:
              serial: {{agingDivisor: 60, swapAffinityBonus: 10}}
    """
    with Served(tmp_path, text) as s:
        yield s


def replay(served: Served, *args: str) -> dict:
    done = subprocess.run(
        [sys.executable, str(REPO / "manage.py"), "replay", "--config", str(served.config_path),
         "--since", "2000-01-01T00:00+00:00", "--json", *args],
        cwd=REPO, env=served.env, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_replay_of_recorded_traffic_reproduces_its_order_and_a_proposed_setting_changes_it(served, rows):
    # Behind a job on alpha, requests for beta and alpha alternate, in three bands: with swap affinity
    # the service serves the loaded model's first; without it, it would swap at nearly every one.
    sent = [("beta", 0), ("alpha", 0), ("beta", 0), ("alpha", 0), ("beta", 0), ("alpha", "batch"),
            ("beta", "interactive"), ("alpha", 0)]
    results: dict[str, int] = {}
    threads = []
    with gpu_held(served, "alpha"):
        for n, (model, priority) in enumerate(sent, 1):
            threads.append(_post_in_thread(served, model, priority, results, f"{n}-{model}"))
            wait_until(lambda n=n: len(rows(served.data_dir, "state='queued'")) == n, what=f"request {n} queued")
    for thread in threads:
        thread.join(60)
    assert set(results.values()) == {200}
    all_rows_terminal(served.data_dir, len(sent) + 1, timeout=30)

    result = replay(served)
    fidelity = result["fidelity"]
    assert fidelity["compared"] == len(sent) + 1  # every request, the held one too (its client cut it)
    assert fidelity["pairs"] >= len(sent) * (len(sent) - 1) // 2
    assert fidelity["same_order"] >= 0.9
    assert result["in_force"]["handling"]["service_assumed"] == 1  # the held job: cut by its client

    without = replay(served, "--set", "swapAffinityBonus=0")
    assert without["proposed"]["settings"]["swapAffinityBonus"] == 0
    assert without["proposed"]["swaps"] > without["in_force"]["swaps"]
    assert without["changed_most"]
