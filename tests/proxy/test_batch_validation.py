"""A batch's validation reads its file into rows; a cancel that lands while it does wins. On PostgreSQL nothing
locks the batch's row meanwhile, so the cancel can commit between validation's check and its last write: that
write must not put the batch back to in_progress (it then ran every line)."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.utils import timezone

from proxy.batches import batch_rows, storage
from scheduling.models import Batch, BatchRequest

pytestmark = pytest.mark.django_db


@pytest.fixture
def batch(settings, tmp_path):
    settings.FILES_DIR = tmp_path
    lines = [json.dumps({"custom_id": f"c{n}", "method": "POST", "url": "/v1/chat/completions",
                         "body": {"model": "chat", "messages": []}}) for n in range(3)]
    storage.path_of("file-in").write_text("\n".join(lines) + "\n")
    return Batch.objects.create(id="batch_v", endpoint="/v1/chat/completions", input_file_id="file-in",
                                runner="me", expires_at=timezone.now() + timedelta(hours=24))


def test_a_cancel_committed_while_the_rows_are_written_wins(batch, monkeypatch):
    create = BatchRequest.objects.bulk_create

    def cancelled_meanwhile(rows, *args, **kwargs):
        # As another connection's committed cancel is seen by the next statement under READ COMMITTED.
        assert Batch.objects.filter(pk=batch.pk).update(status="cancelling", cancelling_at=timezone.now())
        return create(rows, *args, **kwargs)

    monkeypatch.setattr(BatchRequest.objects, "bulk_create", cancelled_meanwhile)
    batch_rows.validate(batch.pk, "me")
    after = Batch.objects.get(pk=batch.pk)
    assert (after.status, after.in_progress_at, after.model) == ("cancelling", None, "chat")
    # Its lines are rows, so the runner ends each with batch_cancelled: every custom_id is in the error file.
    assert batch_rows.end_pending(batch.pk, "batch_cancelled", "cancelled") == 3


def test_without_a_cancel_the_batch_goes_in_progress_with_its_rows(batch):
    batch_rows.validate(batch.pk, "me")
    after = Batch.objects.get(pk=batch.pk)
    assert (after.status, after.model) == ("in_progress", "chat") and after.in_progress_at is not None
    assert list(BatchRequest.objects.filter(batch=batch).order_by("line").values_list("custom_id", flat=True)) \
        == ["c0", "c1", "c2"]
