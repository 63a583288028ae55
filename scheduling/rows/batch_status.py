"""A batch's status as every side changes or reads it: `/v1/batches/<id>/cancel`, the admin's cancel action,
the batch runner and the progress shown. The runner that holds the batch sees a cancel at its next look."""

from __future__ import annotations

from django.utils import timezone

from scheduling.models import Batch

# A batch in one of these has lines still to run or files still to write; the others are ended.
ACTIVE = ("validating", "in_progress", "finalizing", "cancelling")
ENDED = ("completed", "failed", "expired", "cancelled")


def cancel(batch_id: str) -> bool:
    """Ask for the batch to stop: `cancelling` until its runner has let the lines in flight end. False when it
    was not running (ended, already cancelling, or unknown)."""
    return bool(Batch.objects.filter(pk=batch_id, status__in=("validating", "in_progress")).update(
        status="cancelling", cancelling_at=timezone.now()))
