"""A batch's line runs with its key's rights as the key's row stands when the line is sent: refused once the key
no longer counts, and queued with the key's fair-share weight (which a takeover or an edit may have changed)."""

from __future__ import annotations

import asyncio

import pytest

from proxy.batches import line_request
from proxy.serving.errors import ProxyError
from proxy.serving.key_cache import KeyCache
from scheduling.keys.scope import KeyScope
from scheduling.keys.store import make_key, revoke_key
from scheduling.models import ApiKey

pytestmark = pytest.mark.django_db(transaction=True)  # the key cache reads on a thread of its own


@pytest.fixture
def fresh_keys(monkeypatch):
    cache = KeyCache()
    monkeypatch.setattr(line_request, "KEYS", cache)
    return cache


def weight_of(name: str) -> int:
    return asyncio.run(line_request._weight_if_valid(KeyScope(name=name)))


def test_a_line_gets_its_keys_weight_now_and_a_revoked_keys_line_is_refused(fresh_keys):
    make_key(ApiKey(name="heavy", weight=3))
    assert weight_of("heavy") == 3
    assert weight_of("") == 1  # a config file's key or an open server
    revoke_key("heavy")
    fresh_keys._read_at = float("-inf")  # read the rows again now, not REFRESH_S later
    with pytest.raises(ProxyError) as refused:
        weight_of("heavy")
    assert refused.value.status == 401 and "the batch's lines run with its rights" in refused.value.message
