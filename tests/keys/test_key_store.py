"""The key table: a key is stored hashed, validated, revoked, and read with the keys used marked."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError

from scheduling.keys.secrets import matches
from scheduling.keys.store import make_key, read_rows, revoke_key
from scheduling.models import ApiKey

pytestmark = pytest.mark.django_db


def test_a_made_key_stores_its_hash_and_prefix_never_its_secret():
    secret = make_key(ApiKey(name="alice", allowed_models="qwen*, embed", max_priority=0, default_priority=-100))
    row = ApiKey.objects.get(name="alice")
    assert secret.startswith(row.prefix) and matches(secret, row.secret_hash)
    assert all(secret not in str(value) for value in row.__dict__.values())
    assert row.model_globs() == ("qwen*", "embed") and row.enabled and row.last_used_at is None


@pytest.mark.parametrize("fields, field", [
    ({"max_priority": 0, "default_priority": 1}, "default_priority"),
    ({"rpm": 0}, "rpm"),
    ({"tpm": -5}, "tpm"),
    ({"concurrency": 2**53}, "concurrency"),
    ({"weight": 0}, "weight"),
    ({"operator": True, "read_only": True}, "read_only"),
    ({"name": "has space"}, "name"),
    ({"name": "evil\n"}, "name"),  # a trailing newline would split `keys list` and escape `keys revoke evil`
    ({"max_priority": 2**63}, "max_priority"),
    ({"name": "config"}, "name"),  # /metrics' label of the config file's keys: its series would pass for theirs
    ({"name": "None"}, "name"),  # an open server's
    ({"name": "other"}, "name"),  # the names past the label limit
])
def test_a_key_with_a_bad_field_is_refused_naming_it(fields, field):
    with pytest.raises(ValidationError) as refused:
        make_key(ApiKey(**{"name": "k", **fields}))
    assert field in refused.value.message_dict
    assert not ApiKey.objects.exists()


def test_revoking_and_reading_the_rows():
    secret = make_key(ApiKey(name="alice", operator=True))
    make_key(ApiKey(name="bob"))
    rows = read_rows()
    (alice,) = rows.by_prefix[secret[:len(ApiKey.objects.get(name="alice").prefix)]]
    assert rows.count == 2 and alice.scope.name == "alice" and alice.scope.operator and alice.enabled
    assert revoke_key("alice") and not revoke_key("alice") and not revoke_key("nobody")
    rows = read_rows(["bob"])
    assert rows.count == 2  # a revoked key still counts: the table keeps every route behind a key
    assert not any(stored.enabled for stored in rows.by_prefix[alice.prefix])
    assert ApiKey.objects.get(name="bob").last_used_at is not None
    assert ApiKey.objects.get(name="alice").last_used_at is None


def test_the_command_warns_when_a_new_keys_expiry_has_passed():
    from io import StringIO

    from django.core.management import call_command

    out, err = StringIO(), StringIO()
    call_command("keys", "create", "stale", "--expires", "2001-01-01T00:00:00Z", stdout=out, stderr=err)
    assert "--expires 2001-01-01T00:00:00+00:00 has passed: the key is refused from the start" in err.getvalue()
    assert out.getvalue().strip().splitlines()[-1].startswith(ApiKey.objects.get(name="stale").prefix)
    call_command("keys", "create", "fresh", "--expires", "2999-01-01T00:00:00Z", stdout=out, stderr=(later := StringIO()))
    assert "--expires" not in later.getvalue()
