"""Model leases as rows (`scheduling.models.ModelLease`): the ones in force, read by the process that runs the
scheduler (`scheduling.runtime.model_leases`) every `SYNC_S`, so a lease made or revoked in the admin, a restart or
a takeover reaches the scheduler within that time; one made or revoked through the API, before it is answered."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING

from django.db import transaction

if TYPE_CHECKING:
    from scheduling.models import ModelLease

SYNC_S = 1.0
MAX_SECONDS = 30 * 24 * 3600  # a month: longer is a pin (`pinned: true`), not a lease


def leases_in_force() -> list[tuple[int, str, datetime]]:
    """(id, model, expires_at) of every lease not expired yet, soonest to expire first."""
    rows = _rows().objects.filter(expires_at__gt=datetime.now(timezone.utc))
    return [(row.pk, row.model, row.expires_at) for row in rows]


def take_lease(model: str, seconds: float) -> ModelLease:
    now = datetime.now(timezone.utc)
    with transaction.atomic():
        _rows().objects.filter(expires_at__lte=now).delete()  # expired ones go as new ones come
        return _rows().objects.create(model=model, created_at=now, expires_at=now + timedelta(seconds=seconds))


def revoke_lease(lease_id: int) -> bool:
    """Whether a lease in force was revoked."""
    return _rows().objects.filter(pk=lease_id, expires_at__gt=datetime.now(timezone.utc)).delete()[0] > 0


def revoke_leases_of(models: tuple[str, ...] | None) -> list[tuple[int, str]]:
    """Revoke the leases in force on `models` (None: every one): (id, model) of each revoked."""
    with transaction.atomic():
        rows = _rows().objects.select_for_update().filter(expires_at__gt=datetime.now(timezone.utc))
        if models is not None:
            rows = rows.filter(model__in=models)
        revoked = [(row.pk, row.model) for row in rows]
        _rows().objects.filter(pk__in=[lease_id for lease_id, _ in revoked]).delete()
    return revoked


def _rows():
    """The lease rows' model, imported when first used: the scheduler's runtime imports this module, and a bench
    drives that runtime without Django's settings."""
    from scheduling.models import ModelLease

    return ModelLease
