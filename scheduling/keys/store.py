"""The key table (`scheduling.models.ApiKey`): making, listing and revoking keys, and reading them for the
HTTP side's cache. Only here do a secret and its row meet, once, when the key is made."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from functools import cached_property

from django.db import transaction
from django.utils import timezone

from scheduling.keys.quota import QuotaLimits
from scheduling.keys.scope import KeyScope
from scheduling.keys.secrets import new_secret, prefix_of, secret_hash
from scheduling.models import ApiKey


@dataclass(frozen=True)
class StoredKey:
    """A row as the HTTP side checks it: the secret's hash, whether it still counts, and what it allows."""

    prefix: str
    secret_hash: str
    scope: KeyScope
    enabled: bool
    expires_at: datetime | None

    def refusal(self, now: datetime) -> str | None:
        """Why a caller showing this key's secret is refused now, else None."""
        if not self.enabled:
            return f"the API key '{self.scope.name}' is revoked"
        if self.expires_at is not None and self.expires_at <= now:
            return f"the API key '{self.scope.name}' expired at {self.expires_at.isoformat()}"
        return None


@dataclass(frozen=True)
class KeyRows:
    """Every row, by prefix (a presented secret is compared with the rows of its prefix only); `count`
    includes revoked ones: a table that ever had a key keeps every route behind one."""

    by_prefix: dict[str, tuple[StoredKey, ...]]
    count: int

    @cached_property
    def _by_name(self) -> dict[str, StoredKey]:
        """Each row by its name: every open socket of a row key asks after its key a few times a second."""
        return {key.scope.name: key for keys in self.by_prefix.values() for key in keys}

    def named(self, name: str) -> StoredKey | None:
        return self._by_name.get(name)

    def refusal_of(self, name: str, now: datetime) -> str | None:
        """Why the key called `name` no longer counts (revoked, expired, deleted), else None: what runs on its
        behalf after its caller left (a batch's lines) stops with it."""
        stored = self.named(name)
        return f"the API key '{name}' no longer exists" if stored is None else stored.refusal(now)


def scope_of(row: ApiKey) -> KeyScope:
    return KeyScope(name=row.name, models=row.model_globs(), operator=row.operator, read_only=row.read_only,
                    max_priority=row.max_priority, default_priority=row.default_priority,
                    limits=QuotaLimits(row.rpm, row.tpm, row.concurrency),
                    weight=max(1, row.weight))  # a 0 written with SQL counts as 1


def make_key(row: ApiKey) -> str:
    """Save the new key `row` (validated first) with a fresh secret, and return the secret: it is never stored."""
    secret = new_secret()
    row.prefix, row.secret_hash = prefix_of(secret), secret_hash(secret)
    row.full_clean()
    row.save()
    return secret


def revoke_key(name: str) -> bool:
    """Whether a key called `name` that was enabled is now revoked."""
    return ApiKey.objects.filter(name=name, enabled=True).update(enabled=False) > 0


def read_rows(used: Iterable[str] = ()) -> KeyRows:
    """The table as the cache holds it; the keys named in `used` are first marked used now (one write for
    all the requests since the last read)."""
    used = sorted(set(used))
    with transaction.atomic():
        if used:
            ApiKey.objects.filter(name__in=used).update(last_used_at=timezone.now())
        rows = list(ApiKey.objects.all())
    by_prefix: dict[str, tuple[StoredKey, ...]] = {}
    for row in rows:
        stored = StoredKey(row.prefix, row.secret_hash, scope_of(row), row.enabled, row.expires_at)
        by_prefix[row.prefix] = by_prefix.get(row.prefix, ()) + (stored,)
    return KeyRows(by_prefix, len(rows))
