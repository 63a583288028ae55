"""A front end's directory of workers: routes by the latest announcement of a model's set, keeps a dead
worker's routes for the one that takes over, and says when two workers claim one model."""

from __future__ import annotations

import asyncio
import logging

from scheduling.door.directory import WorkerDirectory
from scheduling.door.wire import Announce


async def test_routes_follow_announcements_and_outlive_a_silent_worker():
    directory = WorkerDirectory(silent_after_s=3)
    assert directory.heard(Announce("w1", ("a", "b"), "pid 1"), 0.0), "a new worker: say hello at once"
    assert not directory.heard(Announce("w1", ("a", "b"), "pid 1"), 1.0)
    assert directory.channel_for("a") == "w1" and directory.live(1.0) == ["w1"]
    assert directory.live(10.0) == [] and directory.channel_for("a") == "w1", "kept for the worker that takes over"
    assert directory.heard(Announce("w1", ("a", "b"), "pid 2"), 11.0), "a standby took over: say hello at once"
    assert directory.serving(["b", "zz"], 11.0) == ["w1"] and directory.serving(["zz"], 11.0) == []


async def test_a_request_waits_briefly_for_a_worker_to_announce_its_model():
    directory = WorkerDirectory()
    waiting = asyncio.get_running_loop().create_task(directory.wait_for("a", 5.0))
    await asyncio.sleep(0)
    directory.heard(Announce("w1", ("a",), "pid 1"), 0.0)
    assert await asyncio.wait_for(waiting, 1.0) == "w1"
    assert await directory.wait_for("nobody", 0.01) is None


async def test_two_workers_claiming_one_model_are_named(caplog):
    directory = WorkerDirectory()
    directory.heard(Announce("w1", ("a",), "pid 1 on gpu1"), 0.0)
    with caplog.at_level(logging.WARNING, "llamaswap.frontend"):
        directory.heard(Announce("w2", ("a", "b"), "pid 2 on gpu2"), 0.5)
    assert "model 'a' is announced by two workers (pid 1 on gpu1, and pid 2 on gpu2)" in caplog.text
    assert directory.channel_for("a") == "w2"
