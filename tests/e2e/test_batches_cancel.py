"""When a batch stops sending: no line reaches the model once its cancel has been answered (one process), or
within the runner's poll interval when another front end answered it; a batch whose input file is gone
fails at once, keeping what ran, instead of sending its lines again and again; and a batch whose run keeps
failing still ends, when cancelled or past its window, without waiting out its back-off."""

from __future__ import annotations

import contextlib
import sqlite3
import time
from datetime import datetime

import openai
import pytest

from tests.e2e.conftest import db_rows
from tests.e2e.test_batches import client, config, finished, jsonl, lines_of, start_events, submit
from tests.e2e.test_distributed import config_text, distributed, two_front_ends  # noqa: F401 - the fixture
from tests.served import Served, wait_until

pytestmark = pytest.mark.e2e


def cancel_answered(api: openai.OpenAI, batch_id: str) -> float:
    """Cancel the batch; the time its 200 `cancelling` was in hand."""
    assert api.batches.cancel(batch_id).status == "cancelling"
    return time.time()


@pytest.mark.parametrize("slots, count, delay", [(1, 60, 0.1), (2, 3000, 0.0)])
def test_no_line_is_sent_once_the_cancel_has_answered(tmp_path, slots, count, delay):
    """A line the model starts after the answer was handed to the scheduler before it (at most one per slot)."""
    events = tmp_path / "events.jsonl"
    with Served(tmp_path, config(events, slots)) as served:
        api = client(served)
        batch = submit(api, jsonl(count, delay=delay))
        wait_until(lambda: len(start_events(events)) >= 3, 30, what="three lines to start")
        answered = cancel_answered(api, batch.id)
        done = finished(api, batch.id)
        assert done.status == "cancelled"
        later = [e["id"] for e in start_events(events) if e["t"] > answered]
        assert len(later) <= slots, f"{len(later)} line(s) started after the cancel was answered"
        request_of = {line["custom_id"]: line["response"]["request_id"] for line in lines_of(api, done.output_file_id)}
        arrived = {str(row["id"]): row["arrived_at"] for row in db_rows(served.data_dir)}
        for custom_id in later:
            handed = datetime.fromisoformat(arrived[request_of[custom_id]]).timestamp()
            assert handed < answered, f"{custom_id} was handed to the scheduler after the cancel was answered"


def test_cancelled_through_another_front_end_no_line_is_sent_past_the_poll_interval(tmp_path, distributed):
    env, psycopg = distributed
    events = tmp_path / "events.jsonl"
    text = config_text(events)
    shared = {**env, "LLAMASWAP_FILES_DIR": str(tmp_path / "files")}
    with two_front_ends(tmp_path, text, env, shared) as (first, second):
        api = {served.proc.pid: client(served) for served in (first, second)}
        batch = submit(api[first.proc.pid], jsonl(80, delay=0.05))
        wait_until(lambda: len(start_events(events)) >= 3, 30, what="three lines to start")
        with psycopg.connect(env["DATABASE_URL"]) as connection:
            runner, = connection.execute("SELECT runner FROM scheduling_batch WHERE id = %s", (batch.id,)).fetchone()
        other = next(api_ for pid, api_ in api.items() if f":{pid}:" not in runner)
        answered = cancel_answered(other, batch.id)
        assert finished(other, batch.id).status == "cancelled"
    last = max(e["t"] for e in start_events(events))
    assert last < answered + 1.5, f"a line started {last - answered:.2f} s after the cancel was answered"


def kept_what_ran(api: openai.OpenAI, done, events, total: int, code: str) -> list[dict]:
    """Check that an ended batch kept the result of each line the model started, once, and ended every other
    with `code`; its error file's lines."""
    ran, never = lines_of(api, done.output_file_id), lines_of(api, done.error_file_id)
    started = [e["id"] for e in start_events(events)]
    assert len(started) == len(set(started)), "a line was sent twice"
    assert sorted(line["custom_id"] for line in ran) == sorted(started)
    assert len(ran) + len(never) == total and {line["error"]["code"] for line in never} == {code}
    assert done.request_counts.model_dump() == {"total": total, "completed": len(ran), "failed": len(never)}
    return never


@contextlib.contextmanager
def under_way(tmp_path, delay: float):
    """A service running a batch of 40 lines of `delay` s each, three of them started: (served, api, batch, events)."""
    events = tmp_path / "events.jsonl"
    with Served(tmp_path, config(events)) as served:
        api = client(served)
        batch = submit(api, jsonl(40, delay=delay))
        wait_until(lambda: len(start_events(events)) >= 3, 30, what="three lines to start")
        yield served, api, batch, events


def test_a_batch_whose_input_file_is_gone_fails_keeping_what_ran(tmp_path):
    with under_way(tmp_path, 0.1) as (served, api, batch, events):
        (served.data_dir / "files" / batch.input_file_id).unlink()
        done = finished(api, batch.id, timeout=15)
        assert done.status == "failed" and done.failed_at
        assert [(e.code, e.param) for e in done.errors.data] == [("invalid_file", "input_file_id")]
        assert batch.input_file_id in done.errors.data[0].message
        never = kept_what_ran(api, done, events, 40, "batch_failed")
        assert all(line["response"] is None and batch.input_file_id in line["error"]["message"] for line in never)
        assert "unexpected failure" not in served.log()
        assert served.log().count(f"its input file {batch.input_file_id} is gone") == 1
        assert done.errors.object == "list"


# The runner backs off 1, 2, 4 … 60 s between runs of a batch that fails; an ending is acted on within a poll.
ENDS_WITHIN_S = 2.5


def unreadable(served, file_id: str) -> None:
    """The file turned into a folder: reading it fails with an error the runner does not expect (not a file
    gone, which fails the batch at once), so each run of the batch fails and the runner backs off."""
    source = served.data_dir / "files" / file_id
    source.unlink()
    source.mkdir()


def test_a_batch_whose_run_keeps_failing_is_cancelled_at_once_keeping_what_ran(tmp_path):
    with under_way(tmp_path, 0.05) as (served, api, batch, events):
        unreadable(served, batch.input_file_id)
        wait_until(lambda: "unexpected failure" in served.log(), 30, what="the batch's run to fail")
        cancel_answered(api, batch.id)
        done = finished(api, batch.id, timeout=ENDS_WITHIN_S)
        assert done.status == "cancelled" and done.cancelled_at
        kept_what_ran(api, done, events, 40, "batch_cancelled")
        assert "cancelled while its run was failing" in served.log()  # not by running the batch again


def test_a_batch_that_cannot_be_validated_still_expires_after_its_window(tmp_path):
    """Its run fails before it reads the batch's state, each time: the back-off looks at the window itself."""
    events = tmp_path / "events.jsonl"
    with Served(tmp_path, config(events)) as served:
        api = client(served)
        uploaded = api.files.create(file=("in.jsonl", jsonl(5)), purpose="batch")
        unreadable(served, uploaded.id)
        batch = api.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")
        wait_until(lambda: "unexpected failure" in served.log(), 30, what="the batch's validation to fail")
        with sqlite3.connect(served.data_dir / "llamaswap.sqlite3", timeout=10) as db:  # 24 hours later
            db.execute("UPDATE scheduling_batch SET expires_at = '2000-01-01 00:00:00' WHERE id = ?", (batch.id,))
        done = finished(api, batch.id, timeout=ENDS_WITHIN_S)
        assert done.status == "expired" and done.expired_at and done.output_file_id is None
        assert done.request_counts.model_dump() == {"total": 0, "completed": 0, "failed": 0}
        assert not events.exists() or not start_events(events), "a line of a batch never validated was sent"
