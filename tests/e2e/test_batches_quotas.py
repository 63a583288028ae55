"""A batch's lines count against the quotas of the key that created it, paced rather than refused: over rpm a line
waits for the window to free (and the key's own requests meanwhile get 429: the window is shared), over
concurrency a line waits for a place."""

from __future__ import annotations

import contextlib
import sqlite3
import time

import httpx
import openai
import pytest

from tests.e2e.test_api_keys import auth, chat, new_key
from tests.e2e.test_batches import batch_starts, config, finished, jsonl, lines_of, start_events, submit
from tests.e2e.test_key_quotas import Later
from tests.served import Served, read_events, wait_until

pytestmark = pytest.mark.e2e


def keyed_api(served: Served, *args: str) -> tuple[str, openai.OpenAI]:
    """A new key and a client of it, once the service knows the key (asked without counting a request)."""
    secret = new_key(served, *args)
    wait_until(lambda: httpx.get(served.base + "/v1/files", headers=auth(secret), timeout=10).status_code == 200,
               10, 0.05, "the key to count")
    return secret, openai.OpenAI(base_url=served.base + "/v1", api_key=secret, max_retries=0)


@contextlib.contextmanager
def running_batch(tmp_path, key: tuple[str, ...], content: bytes, started: int, slots: int = 1):
    """A service, a key, and the key's batch of `content` once `started` of its lines have started."""
    events = tmp_path / "events.jsonl"
    with Served(tmp_path, config(events, slots=slots)) as served:
        secret, api = keyed_api(served, *key)
        batch = submit(api, content)
        wait_until(lambda: len(batch_starts(events)) >= started, 30, what=f"{started} line(s) to start")
        yield served, secret, api, batch


def started_at(events) -> dict[str, float]:
    return {e["id"]: e["t"] for e in start_events(events)}


def test_a_batch_of_an_rpm_key_is_paced_by_its_window_and_shares_it(tmp_path):
    events = tmp_path / "events.jsonl"
    with running_batch(tmp_path, ("two-a-minute", "--rpm", "2"), jsonl(3), 2) as (served, secret, api, batch):
        refused = chat(served, "chat", secret)  # the batch's two lines filled the key's window
        assert refused.status_code == 429, refused.text
        assert "over its limit of 2 requests per minute (rpm)" in refused.json()["error"]["message"]
        # The window frees when the first line leaves it, 60 s after it was counted: the third line waits for that
        # (the key's own request is told when), neither failed nor sent. (Its going on once the window frees is
        # test_a_quota_lifted_while_a_line_waits_lets_it_go_on_within_seconds's: waiting out the minute here costs a minute.)
        assert 50 <= int(refused.headers["Retry-After"]) <= 60
        held_until = time.monotonic() + 2.0
        while time.monotonic() < held_until:  # not sent while the window is full (polled: nothing to wait on)
            assert "line-2" not in started_at(events)
            time.sleep(0.1)
        assert api.batches.retrieve(batch.id).status == "in_progress"
        api.batches.cancel(batch.id)
        done = finished(api, batch.id, timeout=10)
        assert done.request_counts.model_dump() == {"total": 3, "completed": 2, "failed": 1}
        [never_sent] = lines_of(api, done.error_file_id)
        assert never_sent["custom_id"] == "line-2" and never_sent["error"]["code"] == "batch_cancelled"
    assert "line-2" not in started_at(events)


def test_a_batch_line_over_its_keys_concurrency_waits_for_a_place(tmp_path):
    events = tmp_path / "events.jsonl"
    with running_batch(tmp_path, ("one-at-once", "--concurrency", "1"), jsonl(6, delay=0.3), 2, slots=2) as (
            served, secret, api, batch):
        mine = Later(served, secret, "interactive")  # waits for the key's one place: not refused
        done = finished(api, batch.id)
        assert mine.result().status_code == 200
        assert done.request_counts.model_dump() == {"total": 6, "completed": 6, "failed": 0}
    assert max(e["in_flight"] for e in read_events(events) if e["event"] == "start") == 1


def test_a_line_waiting_for_its_keys_window_is_not_sent_once_the_batch_is_cancelled(tmp_path):
    events = tmp_path / "events.jsonl"
    with running_batch(tmp_path, ("one-a-minute", "--rpm", "1"), jsonl(3), 1) as (served, _, api, batch):
        api.batches.cancel(batch.id)
        done = finished(api, batch.id, timeout=10)  # not held up by the window (a minute)
        never = lines_of(api, done.error_file_id)
        assert done.status == "cancelled" and batch_starts(events) == ["line-0"]
        assert sorted((line["custom_id"], line["error"]["code"]) for line in never) == [
            ("line-1", "batch_cancelled"), ("line-2", "batch_cancelled")]
        with sqlite3.connect(served.data_dir / "llamaswap.sqlite3") as rows:  # claimed, never sent: no send counted
            attempts = dict(rows.execute("SELECT custom_id, attempts FROM scheduling_batchrequest"))
        assert attempts == {"line-0": 1, "line-1": 0, "line-2": 0}


def test_a_quota_lifted_while_a_line_waits_lets_it_go_on_within_seconds(tmp_path):
    events = tmp_path / "events.jsonl"
    with running_batch(tmp_path, ("lifted", "--rpm", "1"), jsonl(2), 1) as (served, _, api, batch):
        with contextlib.closing(sqlite3.connect(served.data_dir / "llamaswap.sqlite3", timeout=20)) as db, db:
            db.execute("UPDATE scheduling_apikey SET rpm = NULL WHERE name = ?", ("lifted",))
        wait_until(lambda: len(batch_starts(events)) == 2, 5, what="the waiting line to go on (not a minute later)")
        assert finished(api, batch.id).request_counts.model_dump() == {"total": 2, "completed": 2, "failed": 0}
