"""Redis outages in distributed mode: one `llamaswap serve` front end and one `llamaswap worker`, real
processes, each reaching Redis through a relay of its own (the front end reaches PostgreSQL through one
too), so the test cuts one process's Redis alone, as a partition would, and reads what its clients got
and what the rows say."""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from scheduling.door.remote import REDIS_WAIT_S
from scheduling.door.wire import ANNOUNCE_S, FRONT_END_TIMEOUT_S, GOODBYE_S
from tests.e2e.held import HeldRequest, HeldStream
from tests.e2e.test_distributed import distributed  # noqa: F401 (a fixture)
from tests.faults.cluster import MODEL, config_text
from tests.faults.relay import Relay
from tests.faults.run import read_rows
from tests.faults.test_database_outage import through
from tests.served import Served, Worker, read_events, wait_until

pytestmark = pytest.mark.e2e

# docs/distributed.md: a process stopped while Redis is away waits for it at most GOODBYE_S; with nothing to drain, it
# exits within that and a few seconds more (its models stopped, its rows flushed, the interpreter's own exit).
STOP_BOUND_S = GOODBYE_S + 3


@dataclass
class Pair:
    front_end: Served
    worker: Worker
    relays: dict[str, Relay]  # "front end redis", "front end postgres", "worker redis"
    database_url: str
    events: Path

    def ask(self, request_id: str, timeout: float = 30) -> httpx.Response:
        return httpx.post(self.front_end.base + "/v1/chat/completions", timeout=timeout,
                          json={"model": MODEL, "messages": [], "fake": {"id": request_id, "tokens": 2}})

    def rows(self):
        return read_rows(self.database_url)

    def starts(self) -> int:
        """How many times the worker started the model (a swap would start it again)."""
        return self.worker.log().count(f"model '{MODEL}' starting")


@pytest.fixture
def pair(tmp_path, distributed):
    env, _ = distributed
    events = tmp_path / "events.jsonl"
    with paired(tmp_path, env, config_text(events), events) as started:
        yield started


@contextlib.contextmanager
def paired(tmp_path: Path, env: dict, text: str, events: Path) -> Iterator[Pair]:
    """A front end and a worker serving the config `text` (its models' events in `events`), each reaching Redis, and the
    front end PostgreSQL, through a relay of its own; the model loaded by a first request."""
    url, redis_url = env["DATABASE_URL"], env["REDIS_URL"]

    def relay(target: str, name: str) -> Relay:
        parts = urlsplit(target)
        return Relay(parts.hostname, parts.port, name=name).start()

    relays = {"front end redis": relay(redis_url, "fe-redis"), "front end postgres": relay(url, "fe-postgres"),
              "worker redis": relay(redis_url, "w-redis")}
    worker_env = {**env, "REDIS_URL": through(redis_url, relays["worker redis"])}
    (tmp_path / "fe").mkdir()
    try:
        with Worker(tmp_path / "w", text, worker_env) as worker:
            front_env = {"DATABASE_URL": through(url, relays["front end postgres"]),
                         "REDIS_URL": through(redis_url, relays["front end redis"])}
            with Served(tmp_path / "fe", text, env=front_env) as front_end:
                started = Pair(front_end, worker, relays, url, events)
                assert started.ask("warm").status_code == 200  # the model is up, the front end knows the worker
                yield started
    finally:
        for each in relays.values():
            each.close()


def settled(pair: Pair, count: int):
    """The rows, once there are `count` and every one has ended."""
    def ended():
        rows = pair.rows()
        return rows if len(rows) == count and all(r.state not in ("queued", "dispatched") for r in rows) else None

    return wait_until(ended, 30, 0.1, f"{count} rows, every one ended")


class TimedStream(HeldStream):
    """A held stream read to its end on a thread of its own, each event's arrival time noted."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.arrivals: list[float] = [time.monotonic()]
        self._reader = threading.Thread(target=self._read_all, daemon=True)
        self._reader.start()

    def _read_all(self) -> None:
        while self._read_one() is not None:
            self.arrivals.append(time.monotonic())
        self.close()

    def finished(self, timeout: float = 60) -> list[str]:
        self._reader.join(timeout)
        assert not self._reader.is_alive(), "the stream never ended"
        return self.payloads

    def tokens(self) -> int:
        return sum(1 for chunk in self.chunks() if any((c.get("delta") or {}).get("content") for c in chunk.get("choices") or []))


def test_a_request_that_ends_while_its_front_ends_redis_is_away_frees_its_slot_and_later_ones_are_served(pair):
    """The release of a stream that ends during the front end's Redis outage is sent once Redis is back
    (lost, it held the model's one slot for good: every later request waited for ever), and no request
    after the outage meets a connection it broke."""
    stream = TimedStream(pair.front_end, MODEL, tokens=40, tps=40, request_id="ends-in-outage")
    pair.relays["front end redis"].cut()
    assert stream.finished()[-1] == "[DONE]"
    time.sleep(2.0)  # the outage goes on after the stream ended
    pair.relays["front end redis"].restore()
    answers = [pair.ask(f"after-{index}").status_code for index in range(20)]
    assert answers == [200] * 20
    rows = settled(pair, 22)
    assert [row.state for row in rows] == ["completed"] * 22


def test_after_redis_silently_forgot_a_front_ends_connections_every_request_is_served_at_once(pair):
    """Redis lost the front end's connections without a word (its machine rebooted, a firewall forgot them):
    the first failed send drops them all, so no request is refused on a broken pooled connection and the
    listener, blocked on one, is not deaf until its 30 s read timeout."""
    pair.relays["front end redis"].forget()
    for index in range(20):
        asked = time.monotonic()
        assert pair.ask(f"after-{index}").status_code == 200
        assert time.monotonic() - asked < 5, f"request {index} waited {time.monotonic() - asked:.1f} s"
    assert [row.state for row in settled(pair, 21)] == ["completed"] * 21


def test_a_request_that_arrives_during_a_short_redis_outage_of_its_front_end_is_held_and_served(pair):
    pair.relays["front end redis"].cut()
    held = HeldRequest(pair.front_end, MODEL, tokens=2, tps=100, request_id="held")
    time.sleep(REDIS_WAIT_S / 2)  # the outage, shorter than the front end's wait for Redis
    pair.relays["front end redis"].restore()
    assert held.result().status_code == 200
    assert [row.state for row in settled(pair, 2)] == ["completed", "completed"]


def test_a_request_refused_after_the_wait_for_redis_has_one_row_saying_so_written_by_its_front_end(pair):
    """Cut off from Redis and PostgreSQL both (a partition) for longer than its wait for Redis, the front
    end refuses a new request with 503 and writes its row once the database is back."""
    for path in ("front end redis", "front end postgres"):
        pair.relays[path].cut()
    asked = time.monotonic()
    refused = pair.ask("refused")
    waited = time.monotonic() - asked
    for path in ("front end redis", "front end postgres"):
        pair.relays[path].restore()
    assert refused.status_code == 503, refused.text
    assert refused.json()["error"]["code"] == "scheduler_unreachable"
    assert REDIS_WAIT_S <= waited < REDIS_WAIT_S + 3, waited
    ticket = int(refused.headers["x-llamaswap-request-id"])
    rows = settled(pair, 2)
    row = next(row for row in rows if row.id == ticket)
    assert (row.state, row.status_code) == ("rejected", 503)
    assert "Redis" in row.error
    assert pair.ask("after").status_code == 200


def test_a_workers_redis_outage_longer_than_the_silence_limit_cuts_no_stream_and_the_waiting_request_runs_once(pair):
    """The real 5 s silence limit: the worker cut from Redis for longer keeps the running stream's slot and
    model, and the request waiting behind it is served once Redis is back, with one row."""
    outage_s = FRONT_END_TIMEOUT_S + 2
    stream = TimedStream(pair.front_end, MODEL, tokens=int((outage_s + 4) * 40), tps=40, request_id="stream")
    waiting = HeldRequest(pair.front_end, MODEL, tokens=2, tps=100, request_id="waiting")
    wait_until(lambda: [row.state for row in pair.rows()] == ["completed", "dispatched", "queued"], 10, 0.1,
               "the second request waiting behind the stream")
    pair.relays["worker redis"].cut()
    time.sleep(outage_s)  # the fault itself
    pair.relays["worker redis"].restore()
    back = time.time()
    payloads = stream.finished()
    assert payloads[-1] == "[DONE]" and stream.tokens() == int((outage_s + 4) * 40)
    assert waiting.result().status_code == 200
    rows = settled(pair, 3)
    assert [(row.state, row.output_tokens) for row in rows] == [
        ("completed", 2), ("completed", int((outage_s + 4) * 40)), ("completed", 2)]
    assert rows[2].dispatched_at >= back - 0.5, "the waiting request was served once Redis was back"
    assert pair.starts() == 1, "the model was never swapped out"
    assert [e["event"] for e in read_events(pair.events) if e.get("id") == "waiting"] == ["start", "end"]


def test_a_stream_keeps_flowing_through_its_front_ends_redis_outage_and_its_row_says_how_it_ended(pair):
    """A stream's bytes go from the model to the front end directly: its Redis outage (under the silence
    limit) does not slow it, and its release reaches the worker once Redis is back."""
    stream = TimedStream(pair.front_end, MODEL, tokens=200, tps=40, request_id="stream")
    wait_until(lambda: len(stream.arrivals) > 5, 10, 0.05, "the stream flowing")
    pair.relays["front end redis"].cut()
    cut_at = time.monotonic()
    time.sleep(FRONT_END_TIMEOUT_S - 2)  # the fault itself, under the silence limit
    pair.relays["front end redis"].restore()
    restored_at = time.monotonic()
    assert stream.finished()[-1] == "[DONE]" and stream.tokens() == 200
    during = [t for t in stream.arrivals if cut_at < t < restored_at]
    assert len(during) >= (restored_at - cut_at) * 40 * 0.5, "tokens kept coming while Redis was away"
    rows = settled(pair, 2)
    assert [(row.state, row.status_code, row.output_tokens) for row in rows][1] == ("completed", 200, 200)
    assert pair.ask("after").status_code == 200
    log = pair.front_end.log()  # the outage is told once when it begins and once when it ends, per loop
    assert log.count("sending heartbeats over Redis failed") == 1, log
    assert log.count("sending heartbeats over Redis works again") == 1, log
    assert log.count("could not send a heartbeat") == 0 and log.count("; retrying") == 0, log


def test_a_front_end_cut_from_redis_longer_than_the_silence_limit_keeps_one_row_per_request(pair):
    """Past the 5 s silence limit the worker takes the front end for dead and lets its requests go; heard
    from again, it gets them back: the stream it relayed on records how it ended, and the request that
    waited is served under its own row, not a second one."""
    stream = TimedStream(pair.front_end, MODEL, tokens=400, tps=40, request_id="stream")
    waiting = HeldRequest(pair.front_end, MODEL, tokens=2, tps=100, request_id="waiting")
    wait_until(lambda: [row.state for row in pair.rows()] == ["completed", "dispatched", "queued"], 10, 0.1,
               "the second request waiting behind the stream")
    pair.relays["front end redis"].cut()
    wait_until(lambda: "went silent" in pair.worker.log(), FRONT_END_TIMEOUT_S + 5, 0.1,
               "the worker taking the front end for dead")
    pair.relays["front end redis"].restore()
    assert stream.finished()[-1] == "[DONE]" and stream.tokens() == 400
    assert waiting.result().status_code == 200
    expected = [("completed", 2), ("completed", 400), ("completed", 2)]  # the stream's once its release is read
    wait_until(lambda: [(row.state, row.output_tokens) for row in pair.rows()] == expected, 30, 0.1,
               f"rows {expected}, not {[(row.state, row.output_tokens) for row in pair.rows()]}")


def test_a_worker_stopped_while_its_redis_is_away_exits_cleanly_and_told_the_outage_once(pair):
    assert pair.ask("first").status_code == 200
    settled(pair, 2)  # its release reached the worker: nothing is left to drain
    pair.relays["worker redis"].cut()
    wait_until(lambda: "announcing this worker over Redis failed" in pair.worker.log(), 10, 0.1, "the outage noticed")
    time.sleep(3)  # the fault goes on for a few announce rounds
    stopped_at = time.monotonic()
    pair.worker.proc.send_signal(signal.SIGTERM)
    assert pair.worker.proc.wait(120) == 0
    assert time.monotonic() - stopped_at < STOP_BOUND_S
    log = pair.worker.log()
    assert "Traceback" not in log and "stopping without reading the rest of this worker's channel" in log, log
    assert log.count("announcing this worker over Redis failed") == 1, log


@pytest.mark.parametrize("process", ["worker", "front end"])
def test_a_process_stopped_while_redis_is_silent_exits_within_its_bound(pair, process):
    """Redis silent rather than refusing (a partition: connections open, no byte back): a stopping process waits
    for it at most GOODBYE_S, not the 30 s Redis read timeout each of its goodbyes would otherwise take."""
    settled(pair, 1)  # the warm request's release reached the worker: nothing is left to drain
    pair.relays[f"{process} redis"].stall()
    time.sleep(ANNOUNCE_S)  # the fault itself, for a full announce round
    handle = pair.worker if process == "worker" else pair.front_end
    stopped_at = time.monotonic()
    handle.proc.send_signal(signal.SIGTERM)
    assert handle.proc.wait(120) == 0
    assert time.monotonic() - stopped_at < STOP_BOUND_S, handle.log()
    assert "Traceback" not in handle.log(), handle.log()
