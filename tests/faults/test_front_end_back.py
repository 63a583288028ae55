"""A front end cut from Redis for longer than the worker's 5 s silence limit is alive: its clients still
wait, and the streams it relays still flow (their bytes never cross Redis). The worker takes it for dead
and gives its slots away; heard from again, the front end keeps its requests, each under one row that
ends as its client's answer did. Real processes: two front ends, a worker and a standby, each reaching
Redis through a relay of its own (`tests.faults.cluster`)."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest

from scheduling.door.wire import FRONT_END_TIMEOUT_S
from tests.e2e.held import HeldRequest, model_events
from tests.faults.cluster import MODEL, SERVING, Cluster
from tests.faults.test_redis_outage import TimedStream
from tests.served import read_events, wait_until

pytestmark = pytest.mark.e2e

OUTAGE_S = FRONT_END_TIMEOUT_S + 2  # past the worker's last look at the silence (it looks four times a limit)
TPS = 40
STREAM_TOKENS = int((OUTAGE_S + 5) * TPS)  # runs on after the outage
BEHIND_TOKENS = 8 * TPS  # still running when the cut-off front end is back


def test_a_front_end_heard_from_again_keeps_its_stream_and_its_waiting_request_each_under_one_row(
    tmp_path, postgres, redis_url
):
    url, _ = postgres
    cluster = Cluster(tmp_path, "distributed", url, redis_url).start()
    try:
        cut_off, other = cluster.front_ends
        worker = cluster.workers[0]

        def rows():
            return other.handle.rows()

        stream = TimedStream(cut_off.handle, MODEL, tokens=STREAM_TOKENS, tps=TPS, request_id="stream")
        waiting = HeldRequest(cut_off.handle, MODEL, tokens=2, tps=100, request_id="waiting")
        wait_until(lambda: [row["state"] for row in rows()] == ["dispatched", "queued"], 10, 0.05,
                   "the cut-off front end's second request waiting behind its stream")
        behind = HeldRequest(other.handle, MODEL, tokens=BEHIND_TOKENS, tps=TPS, request_id="behind")
        wait_until(lambda: [row["state"] for row in rows()] == ["dispatched", "queued", "queued"], 10, 0.05,
                   "the other front end's request waiting too")
        stream_id, waiting_id, behind_id = (row["id"] for row in rows())

        cut_off.relays["redis"].cut()
        time.sleep(OUTAGE_S)  # the fault itself
        assert "went silent" in worker.log(), "the worker took the cut-off front end for dead"
        dropped = {row["id"]: row for row in rows()}
        assert dropped[waiting_id]["state"] == "cancelled", dropped[waiting_id]
        assert dropped[behind_id]["state"] == "dispatched", "the slot the stream held was given away"
        cut_off.relays["redis"].restore()
        back = time.time()

        def queued_again():
            row = next(row for row in rows() if row["id"] == waiting_id)
            return row if row["state"] == "queued" else None

        row = wait_until(queued_again, 10, 0.05, "the waiting request's own row queued again")
        assert "heard from again" in row["explanation"] and not row["error"] and row["finished_at"] is None, row

        assert stream.finished()[-1] == "[DONE]" and stream.tokens() == STREAM_TOKENS
        assert waiting.result().status_code == 200
        assert behind.result().status_code == 200
        settled = {row["id"]: row for row in other.handle.check_settled(MODEL)}
        assert len(settled) == 4, "one row per request, and the one asked after the fault"
        ended = {tid: (row["state"], row["status_code"], row["output_tokens"]) for tid, row in settled.items()}
        assert ended[stream_id] == ("completed", 200, STREAM_TOKENS), settled[stream_id]
        assert ended[waiting_id] == ("completed", 200, 2), settled[waiting_id]
        assert ended[behind_id] == ("completed", 200, BEHIND_TOKENS), settled[behind_id]
        served = settled[waiting_id]
        assert served["dispatched_at"].timestamp() >= back, "served once its front end was back"
        assert served["dispatched_at"] >= settled[behind_id]["finished_at"] - timedelta(seconds=0.1), (
            "waited for the one slot, which was given away meanwhile")
        assert served["arrived_at"] < settled[behind_id]["arrived_at"], "its row keeps when it arrived"
        assert model_events(cluster.events, "waiting") == ["start", "end"], "sent to the model once"
    finally:
        cluster.close()


def test_a_front_end_heard_from_again_by_the_worker_that_took_over_meanwhile_keeps_one_row_per_request(
    tmp_path, postgres, redis_url
):
    """The worker that let the front end's requests go is killed before the front end is back: the standby
    reads them from the rows, so the waiting request is still queued under its own row, and the stream's row
    says how it ended (the standby stops the dead worker's model, which cuts it)."""
    url, _ = postgres
    cluster = Cluster(tmp_path, "distributed", url, redis_url).start()
    try:
        cut_off, other = cluster.front_ends
        active, standby = cluster.workers
        stream = TimedStream(cut_off.handle, MODEL, tokens=STREAM_TOKENS, tps=TPS, request_id="stream")
        waiting = HeldRequest(cut_off.handle, MODEL, tokens=2, tps=100, request_id="waiting")
        wait_until(lambda: [row["state"] for row in other.handle.rows()] == ["dispatched", "queued"], 10, 0.05,
                   "the second request waiting behind the stream")
        cut_off.relays["redis"].cut()
        wait_until(lambda: [row["state"] for row in other.handle.rows()] == ["cancelled", "cancelled"],
                   FRONT_END_TIMEOUT_S + 5, 0.05, "the worker taking the cut-off front end for dead")
        active.kill()
        wait_until(lambda: SERVING in standby.log(), 30, 0.05, "the standby to take over")
        cut_off.relays["redis"].restore()

        payloads = stream.finished()
        whole = payloads[-1] == "[DONE]" and stream.tokens() == STREAM_TOKENS
        assert waiting.result().status_code == 200
        rows = other.handle.check_settled(MODEL)
        assert len(rows) == 3, [(row["id"], row["state"], row["error"]) for row in rows]
        if whole:
            assert (rows[0]["state"], rows[0]["output_tokens"]) == ("completed", STREAM_TOKENS), rows[0]
        else:
            assert rows[0]["state"] == "failed" and rows[0]["error"], rows[0]
        assert (rows[1]["state"], rows[1]["output_tokens"]) == ("completed", 2), rows[1]
        assert model_events(cluster.events, "waiting") == ["start", "end"], "sent to the model once"
    finally:
        cluster.close()


def test_a_grant_sent_while_its_front_end_was_cut_off_and_let_go_meanwhile_is_not_used(tmp_path, postgres, redis_url):
    """The worker grants a cut-off front end's queued request (the grant waits in Redis), then takes the front
    end for dead and gives the slot to another request. Back, the front end reads the grant: using it would
    send a second job to the one-slot model. It asks the worker first, and waits for the slot again under the
    request's own row."""
    url, _ = postgres
    cluster = Cluster(tmp_path, "distributed", url, redis_url).start()
    try:
        cut_off, other = cluster.front_ends
        worker = cluster.workers[0]
        ahead = HeldRequest(other.handle, MODEL, tokens=2 * TPS, tps=TPS, request_id="ahead")  # 2 s
        wait_until(lambda: [row["state"] for row in other.handle.rows()] == ["dispatched"], 10, 0.05, "the first job")
        waiting = HeldRequest(cut_off.handle, MODEL, tokens=2, tps=100, request_id="waiting")
        wait_until(lambda: [row["state"] for row in other.handle.rows()] == ["dispatched", "queued"], 10, 0.05,
                   "the cut-off front end's request waiting behind it")
        cut_off.relays["redis"].cut()
        assert ahead.result().status_code == 200  # its end grants the waiting request, into the cut-off channel
        wait_until(lambda: "went silent" in worker.log(), FRONT_END_TIMEOUT_S + 5, 0.1, "the worker letting it go")
        behind = HeldRequest(other.handle, MODEL, tokens=4 * TPS, tps=TPS, request_id="behind")  # 4 s, the slot
        wait_until(lambda: "start" in model_events(cluster.events, "behind"), 10, 0.05, "the slot given away")
        cut_off.relays["redis"].restore()
        assert waiting.result().status_code == 200
        assert behind.result().status_code == 200
        starts = [e for e in read_events(cluster.events) if e.get("event") == "start" and e.get("id") in ("behind", "waiting")]
        assert [e["id"] for e in starts] == ["behind", "waiting"] and max(e["in_flight"] for e in starts) == 1, starts
        settled = other.handle.check_settled(MODEL)
        assert [(row["state"], row["status_code"]) for row in settled] == [("completed", 200)] * 4, settled
    finally:
        cluster.close()
