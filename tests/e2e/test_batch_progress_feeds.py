"""A running batch's progress where dashboards read it: `batchProgress` events on `/api/events` and the batch
series of `/metrics`, from a real `llamaswap serve` running a real batch."""

from __future__ import annotations

import pytest

from tests.e2e.test_api_events import EventReader
from tests.e2e.test_batches import batch_starts, client, config, finished, jsonl, submit
from tests.e2e.test_metrics_e2e import Scrape, until
from tests.served import Served, wait_until

pytestmark = pytest.mark.e2e


def test_a_batch_s_progress_reaches_the_event_stream_and_the_metrics(tmp_path):
    events = tmp_path / "events.jsonl"
    with Served(tmp_path, config(events)) as served:
        api = client(served)
        reader = EventReader(served)
        try:
            batch = submit(api, jsonl(12, delay=0.2))
            wait_until(lambda: len(batch_starts(events)) >= 3, 30, what="three lines to start")
            running = until(served, lambda s: s.get("llamaswap_batches", status="in_progress") == 1
                            and s.get("llamaswap_batch_lines", state="succeeded") >= 2, "the batch's lines in /metrics")
            assert running.get("llamaswap_batch_lines", state="running") == 1  # one slot: one line at a time
            waiting = [running.get("llamaswap_batch_lines", state=state) for state in ("pending", "claimed")]
            assert 0 < sum(waiting) <= 9, waiting  # claimed: read ahead of the one at the model, not sent yet

            def progress(e) -> bool:
                return e["type"] == "batchProgress" and e["data"]["id"] == batch.id

            at, moving = reader.wait_for(lambda e: progress(e) and e["data"]["succeeded"] >= 3, what="progress")
            assert moving["data"]["total"] == 12 and moving["data"]["status"] == "in_progress"
            assert moving["data"]["left"] == 12 - moving["data"]["succeeded"]
            # The lines left, one at a time, at the 0.2 s each took so far.
            assert 0.1 * moving["data"]["left"] <= moving["data"]["time_left_s"] <= 0.4 * moving["data"]["left"]
            _, last = reader.wait_for(lambda e: progress(e) and e["data"]["status"] == "completed", after=at,
                                      what="the batch's end")
            assert (last["data"]["succeeded"], last["data"]["left"], last["data"]["time_left_s"]) == (12, 0, None)
            told = [e["data"]["succeeded"] for e in reader.events if progress(e)]
            assert told == sorted(told), told  # each event newer than the last
        finally:
            reader.close()
        assert finished(api, batch.id).status == "completed"
        ended = Scrape(served)
        assert ended.get("llamaswap_batches", status="completed") == 1
        assert ended.get("llamaswap_batches", status="in_progress") == 0
        assert ended.get("llamaswap_batch_lines_ended_total", outcome="succeeded") == 12
        assert ended.get("llamaswap_batch_lines", state="pending") == 0  # an ended batch's lines are not counted
