"""Requests of the Files and Batch APIs that are refused with a clear 400 rather than taken in part or silently,
and the temporary files a killed process left, removed at the next start once they are old."""

from __future__ import annotations

import os
import time

import httpx
import openai
import pytest

from tests.e2e.test_batches import client, config, finished, jsonl, submit
from tests.served import Served, wait_until

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("batch-refusals")
    with Served(tmp, config(tmp / "events.jsonl")) as s:
        yield s


def test_cancelling_an_ended_batch_is_400_naming_its_status(served):
    api = client(served)
    batch = submit(api, jsonl(1))
    assert finished(api, batch.id).status == "completed"
    with pytest.raises(openai.BadRequestError) as refused:
        api.batches.cancel(batch.id)
    error = refused.value.body
    assert error["code"] == "batch_not_cancellable" and "its status is 'completed'" in error["message"], error
    assert api.batches.retrieve(batch.id).status == "completed"


def test_a_bad_order_of_the_file_list_is_400(served):
    listed = httpx.get(served.base + "/v1/files", params={"order": "sideways"}, timeout=10)
    assert listed.status_code == 400 and listed.json()["error"]["code"] == "invalid_order", listed.text
    assert httpx.get(served.base + "/v1/files", params={"order": "asc"}, timeout=10).status_code == 200


@pytest.mark.parametrize("fields, files", [
    ({"purpose": ["batch", "batch"]}, [("file", ("in.jsonl", jsonl(1)))]),
    ({"purpose": "batch"}, [("file", ("in.jsonl", jsonl(1))), ("file", ("also.jsonl", jsonl(2)))]),
], ids=["purpose", "file"])
def test_an_upload_repeating_a_field_is_400_naming_it_and_nothing_is_kept(served, fields, files):
    kept = set((served.data_dir / "files").iterdir())
    sent = httpx.post(served.base + "/v1/files", data=fields, files=files, timeout=10)
    assert sent.status_code == 400, sent.text
    assert f"the field '{files[0][0] if len(files) > 1 else 'purpose'}' more than once" in sent.json()["error"]["message"]
    assert set((served.data_dir / "files").iterdir()) == kept


def test_a_partial_file_a_killed_process_left_is_removed_at_start_once_an_hour_old(tmp_path):
    files = tmp_path / "data" / "files"
    files.mkdir(parents=True)
    old, recent = files / "file-old.partial", files / "file-recent.partial"
    for path in (old, recent):
        path.write_bytes(b'{"custom_id": "half')
    two_hours_ago = time.time() - 7200
    os.utime(old, (two_hours_ago, two_hours_ago))
    with Served(tmp_path, config(tmp_path / "events.jsonl")) as started:
        wait_until(lambda: not old.exists(), 10, 0.05, "the old partial file to be removed")
        assert recent.exists()  # another front end sharing the folder may be writing it
        assert "removed 1 file(s) left half-written" in started.log()
