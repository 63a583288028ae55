"""Rows as the objects of OpenAI's Files and Batch APIs, field for field."""

from __future__ import annotations

from datetime import datetime

from scheduling.models import Batch, BatchFile

_TIMES = ("in_progress_at", "finalizing_at", "completed_at", "failed_at", "expired_at", "cancelling_at",
          "cancelled_at")


def unix(moment: datetime | None) -> int | None:
    return None if moment is None else int(moment.timestamp())


def file_object(row: BatchFile) -> dict:
    return {
        "id": row.id, "object": "file", "bytes": row.bytes, "created_at": unix(row.created_at),
        "filename": row.filename, "purpose": row.purpose, "status": "processed", "status_details": None,
        "expires_at": None,
    }


def batch_object(row: Batch, counts: dict[str, int]) -> dict:
    """`counts`: {"total", "completed", "failed"} (see `batch_rows.request_counts`)."""
    shown = {
        "id": row.id, "object": "batch", "endpoint": row.endpoint, "errors": row.errors,
        "input_file_id": row.input_file_id, "completion_window": row.completion_window, "status": row.status,
        "output_file_id": row.output_file_id or None, "error_file_id": row.error_file_id or None,
        "created_at": unix(row.created_at), "expires_at": unix(row.expires_at),
    }
    shown.update({name: unix(getattr(row, name)) for name in _TIMES})
    shown["request_counts"] = counts
    shown["metadata"] = row.metadata
    return shown


def page(items: list[dict], has_more: bool) -> dict:
    """A list answer with OpenAI's cursor fields."""
    return {"object": "list", "data": items, "first_id": items[0]["id"] if items else None,
            "last_id": items[-1]["id"] if items else None, "has_more": has_more}
