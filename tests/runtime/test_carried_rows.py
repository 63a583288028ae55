"""What a worker taking over reads back from the rows for each queued request: everything its
front end asked for, the caller's maximum wait included."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from scheduling.models import QueuedRequest
from scheduling.rows.recovery import carried_requests

pytestmark = pytest.mark.django_db


def test_a_carried_request_keeps_its_maximum_wait_and_its_route():
    arrived = datetime(2026, 12, 3, 12, 0, tzinfo=timezone.utc)
    for ticket_id, max_wait in ((7, 2.5), (8, None)):
        QueuedRequest.objects.create(
            id=ticket_id, model="m", path="/v1/chat/completions", route="/v1/chat/completions", stream=True,
            origin=f"front#{ticket_id}", state="queued", arrived_at=arrived, max_wait_s=max_wait, priority=100,
        )
    carried = {c.ticket_id: c for c in carried_requests(["m"])}
    assert carried[7].request.max_wait_s == 2.5 and carried[8].request.max_wait_s is None
    assert carried[7].request.route == "/v1/chat/completions" and carried[7].request.stream
    assert carried[7].request.priority == 100 and carried[7].arrived_at == arrived


def test_a_carried_request_gets_its_keys_fair_share_weight():
    from scheduling.keys.store import make_key
    from scheduling.models import ApiKey

    make_key(ApiKey(name="heavy", weight=3))
    arrived = datetime(2026, 12, 3, 12, 0, tzinfo=timezone.utc)
    for ticket_id, key in ((1, "heavy"), (2, ""), (3, "deleted-since")):
        QueuedRequest.objects.create(id=ticket_id, model="m", path="/v1/chat/completions", origin=f"front#{ticket_id}",
                                     state="queued", arrived_at=arrived, api_key=key)
    weights = {c.ticket_id: c.request.key_weight for c in carried_requests(["m"])}
    assert weights == {1: 3, 2: 1, 3: 1}
