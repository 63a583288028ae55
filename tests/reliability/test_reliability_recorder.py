"""The recorder against the real database: values that do not fit are made to, and a row the
database refuses is lost alone, never with the rows written in the same batch."""

from __future__ import annotations

import logging
from datetime import datetime, timezone

import pytest

from scheduling.models import QueuedRequest
from scheduling.rows.recorder import Recorder

pytestmark = pytest.mark.django_db(transaction=True)

ARRIVED = datetime(2026, 1, 1, tzinfo=timezone.utc)


def queued(**fields) -> dict:
    return {"model": "m", "path": "/v1/chat/completions", "state": "queued", "arrived_at": ARRIVED, **fields}


def write_in_one_batch(changes) -> None:
    """Queue every change before the writer thread starts, so they all land in its first batch."""
    recorder = Recorder()
    for kind, ticket_id, fields in changes:
        getattr(recorder, kind)(ticket_id, **fields)
    recorder.start()
    assert recorder.flush()
    recorder.close()


def test_a_row_the_database_refuses_is_lost_alone_and_named_in_the_log(caplog):
    QueuedRequest.objects.create(id=2, **queued(state="completed", model="earlier"))
    with caplog.at_level(logging.ERROR, logger="llamaswap.recorder"):
        write_in_one_batch([
            ("create", 1, queued()),
            ("create", 2, queued()),  # the id is taken: this creation is refused
            ("create", 3, queued()),
            ("update", 1, {"state": "completed", "status_code": 200}),
            ("update", 2, {"state": "completed", "status_code": 200}),
            ("update", 3, {"state": "failed", "status_code": 502}),
        ])
    rows = {row.id: (row.model, row.state, row.status_code) for row in QueuedRequest.objects.all()}
    assert rows == {1: ("m", "completed", 200), 2: ("earlier", "completed", None), 3: ("m", "failed", 502)}
    [refused] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert "request #2" in refused.getMessage() and "IntegrityError" in refused.getMessage()


def test_values_beyond_their_columns_are_stored_fitted():
    write_in_one_batch([
        ("create", 1, queued(method="X" * 40, path="/upstream/m/a\x00b\ud800c", priority=2**70,
                             client="c" * 500, requested_model="r" * 300)),
        ("update", 1, {"state": "completed", "fifo_priority": -(2**70), "input_tokens": 10**30,
                       "output_tokens": -(10**30), "tokens_per_second": float("inf"),
                       "prompt_per_second": float("nan"), "score_aging": 10**400}),
    ])
    row = QueuedRequest.objects.get(id=1)
    assert row.method == "X" * 32 and row.path == "/upstream/m/a\ufffdb?c"
    assert row.client == "c" * 100 and row.requested_model == "r" * 255
    assert (row.priority, row.fifo_priority) == (2**63 - 1, -(2**63))
    # SQLite's integer columns are all 64-bit; on PostgreSQL an IntegerField clamps at 32 bits.
    assert (row.input_tokens, row.output_tokens) == (2**63 - 1, -(2**63))
    assert row.tokens_per_second is None and row.prompt_per_second is None and row.score_aging is None
    assert row.state == "completed"


def test_new_rows_are_written_with_the_values_a_model_instance_would_give(monkeypatch):
    """Rows inserted from their fields carry, column for column, what the same rows as model instances carry:
    given values prepared for saving, defaults for the rest, NULL for None."""
    from scheduling.rows import recorder

    creates = {
        1: queued(priority=5, client="127.0.0.1", stream=True, tokens_per_second=12.5, api_key="k",
                   explanation="", slot=0),
        2: queued(model="other", dispatched_at=ARRIVED, status_code=None, method="POST"),
        3: {"model": "m", "path": "/v1/completions", "state": "queued", "arrived_at": ARRIVED},
    }
    written = []
    monkeypatch.setattr(recorder, "_execute_insert", lambda model, values: written.append(values))
    recorder._insert_new_rows(QueuedRequest, creates)
    recorder._insert_rows(QueuedRequest, [QueuedRequest(id=tid, **recorder.storable(QueuedRequest, fields))
                                          for tid, fields in creates.items()])
    from_fields, from_instances = written
    assert from_fields == from_instances
    assert recorder._plain_columns(QueuedRequest) is not None  # the path compared above is the one taken


def test_a_new_row_with_a_field_the_model_lacks_is_refused_as_by_the_model():
    from scheduling.rows import recorder

    with pytest.raises(TypeError):
        recorder._insert_new_rows(QueuedRequest, {1: queued(no_such_column=1)})
