"""The admin's Batches page lists each batch with its lines' counts, and changes nothing."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from scheduling.models import Batch, BatchRequest

pytestmark = pytest.mark.django_db
LIST_URL = "/admin/scheduling/batch/"


def test_a_batch_is_listed_with_its_lines_counts_and_cannot_be_changed(admin_client):
    batch = Batch.objects.create(id="batch_abc", endpoint="/v1/embeddings", input_file_id="file-x", status="in_progress",
                                 model="embed", expires_at=timezone.now() + timedelta(hours=24))
    for line, state in enumerate(["succeeded", "succeeded", "failed", "pending"], start=1):
        BatchRequest.objects.create(batch=batch, line=line, custom_id=str(line), offset=0, length=1, state=state)
    page = admin_client.get(LIST_URL)
    assert page.status_code == 200
    html = page.content.decode()
    assert '<progress value="3" max="4"></progress> <span class="counts">2 done, 1 failed, 4 total</span>' in html
    assert admin_client.get(LIST_URL + "add/").status_code == 403
    assert admin_client.post(LIST_URL + "batch_abc/delete/", {"post": "yes"}).status_code == 403
    assert Batch.objects.filter(pk="batch_abc").exists()
