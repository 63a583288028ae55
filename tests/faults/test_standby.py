"""A standby worker takes over from a dead worker, never from a live one whose database connection
blinked: the database frees the advisory lock either way, so the standby looks at the process that
held it (both run on this machine here) before it stops that worker's models and cuts its streams."""

from __future__ import annotations

import json
import time

import pytest

from tests.e2e.held import HeldStream
from tests.faults.cluster import MODEL, SERVING, Cluster
from tests.served import read_events, wait_until

pytestmark = pytest.mark.e2e


def test_a_database_blink_of_the_active_worker_alone_hands_nothing_to_the_standby(tmp_path, postgres, redis_url):
    url, _ = postgres
    cluster = Cluster(tmp_path, "distributed", url, redis_url).start()
    try:
        active, standby = cluster.workers
        front_end = cluster.front_ends[0]
        held = HeldStream(front_end.handle, MODEL, tokens=300, tps=50, request_id="held")  # about 6 s
        relay = active.relays["postgres"]
        relay.cut()  # the database server sees the active worker's connections end: its lock is free
        wait_until(lambda: "came free while" in standby.log(), 20, 0.05, "the standby to find the lock free")
        time.sleep(1.0)  # the cut lasts on: the active worker cannot take its lock back yet
        relay.restore()
        wait_until(lambda: "took the database lock again" in active.log(), 20, 0.05, "the active worker's lock")
        payloads = held.read_to_end()
        assert payloads[-1] == "[DONE]" and not any("error" in json.loads(p) for p in payloads[:-1]), payloads[-3:]
        assert SERVING not in standby.log() and active.alive(), standby.log()
        starts = [e for e in read_events(cluster.events) if e["event"] == "start"]
        assert [e["id"] for e in starts] == ["held"]  # nobody started the model again

        wait_until(lambda: front_end.handle.rows()[0]["state"] == "completed", 10, 0.05, "the held row to end")
        active.kill()
        began = time.monotonic()
        wait_until(lambda: SERVING in standby.log(), 30, 0.05, "the standby to take over from the dead worker")
        assert time.monotonic() - began < 10  # at once, not after a grace: its pid is gone
        rows = front_end.handle.check_settled(MODEL)
        assert [row["state"] for row in rows] == ["completed", "completed"], rows
    finally:
        cluster.close()
