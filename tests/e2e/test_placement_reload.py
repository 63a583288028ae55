"""Reloads that change `hardware:` under running models, end to end with the fake model servers: a GPU removed
while a model streams on it stays, retiring, until that model stops; requests meanwhile are served, never a 500;
the model comes back on a GPU the config lists."""

from __future__ import annotations

import textwrap

import httpx
import pytest

from tests.e2e.test_config_reload import rewrite
from tests.e2e.test_placement import ask, devices, loaded
from tests.served import Served, fake_cmd, wait_until

pytestmark = pytest.mark.e2e


def config(events, gpus: tuple[str, ...]) -> str:
    """Models a, b and c of 10 GiB on the GPUs named, each of 24 GiB."""
    listed = "".join(f"\n            - {{id: {gpu}, memory: 24GiB}}" for gpu in gpus)
    models = "".join(f"""
          {name}:
            cmd: {fake_cmd(name, events)}
            memory: 10GiB""" for name in "abc")
    return f"""
        healthCheckTimeout: 20
        hardware:
          gpus:{listed}
        models:{models}
    """


def placement(served) -> dict:
    return httpx.get(served.base + "/api/placement", timeout=10).json()["boxes"][0]


def test_a_gpu_removed_under_a_streaming_model_retires_with_it_and_the_model_returns_on_a_listed_gpu(tmp_path):
    events = tmp_path / "events.jsonl"
    with Served(tmp_path, config(events, ("0", "1")), extra_args=("--watch-config",)) as served:
        assert ask(served, "a").status_code == 200
        holder = {"model": "b", "stream": True, "messages": [], "fake": {"tokens": 1_000_000, "tps": 10}}
        with httpx.stream("POST", served.base + "/v1/chat/completions", json=holder, timeout=60) as held:
            assert held.status_code == 200
            lines = held.iter_lines()  # kept: a dropped iterator's finaliser would close the stream
            assert next(lines).startswith("data:")
            assert devices(events) == {"a": ["0"], "b": ["1"]}
            rewrite(served, textwrap.dedent(config(events, ("0",))))
            wait_until(lambda: "config reloaded" in served.log(), timeout=15, what="the reload")
            shown = placement(served)
            assert [(g["id"], g["models"], g["retiring"]) for g in shown["gpus"]] == [
                ("0", ["a"], False), ("1", ["b"], True)]
            assert ask(served, "a").status_code == 200
            assert ask(served, "c").status_code == 200  # beside a on GPU 0; nothing new goes on GPU 1
            assert devices(events)["c"] == ["0"]
            asked = httpx.get(served.base + "/api/placement/can-load/b", timeout=10)
            assert asked.status_code == 200
        wait_until(lambda: "b" not in loaded(served), timeout=15, what="b to stop once its stream ended")
        assert [g["id"] for g in placement(served)["gpus"]] == ["0"]  # the retiring GPU left with b
        assert ask(served, "b").status_code == 200  # on GPU 0, stopping a or c to make room
        assert devices(events)["b"] == ["1", "0"]
        assert " 500 " not in served.log() and "Traceback" not in served.log()
