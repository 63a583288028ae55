"""The pure parts of API keys: the secret's hash, a key's model globs and priority clamp, and the decision
who a request comes from and what it may do."""

from __future__ import annotations

import base64
from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.serving.auth import presented_keys, without_own_cookies
from proxy.serving.access import OPEN, Caller, Denied, Need, identify, model_refusal, route_refusal
from proxy.serving.cross_site import cross_site_refusal
from scheduling.core.priority import INT64_MAX, INT64_MIN
from scheduling.keys.scope import UNRESTRICTED, KeyScope, globs_from_text
from scheduling.keys.secrets import PREFIX_LENGTH, SECRET_MARK, matches, new_secret, prefix_of, secret_hash
from scheduling.keys.store import KeyRows, StoredKey

NOW = datetime(2026, 12, 5, 12, 0, tzinfo=timezone.utc)
priorities = st.integers(INT64_MIN, INT64_MAX)


def rows_of(*keys: tuple[str, KeyScope, bool, datetime | None]) -> KeyRows:
    by_prefix: dict[str, tuple[StoredKey, ...]] = {}
    for secret, scope, enabled, expires_at in keys:
        stored = StoredKey(prefix_of(secret), secret_hash(secret), scope, enabled, expires_at)
        by_prefix[stored.prefix] = by_prefix.get(stored.prefix, ()) + (stored,)
    return KeyRows(by_prefix, len(keys))


def bearer(secret: str) -> dict[str, str]:
    return {"authorization": f"Bearer {secret}"}


# -- the secret ------------------------------------------------------------------------------------------

def test_a_secret_is_long_random_marked_and_its_hash_matches_only_itself():
    one, two = new_secret(), new_secret()
    assert one != two and one.startswith(SECRET_MARK) and len(one) >= len(SECRET_MARK) + 43  # 32 bytes, base64
    assert len(prefix_of(one)) == PREFIX_LENGTH and one.startswith(prefix_of(one))
    stored = secret_hash(one)
    assert stored != one and len(stored) == 64 and one not in stored
    assert matches(one, stored) and not matches(two, stored) and not matches(one[:-1], stored)


# -- scopes -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("globs, model, allowed", [
    ((), "anything", True),
    (("qwen*",), "qwen3", True),
    (("qwen*",), "llama", False),
    (("qwen*",), "Qwen3", False),  # case-sensitive, as model IDs are
    (("qwen?", "embed"), "embed", True),
    (("qwen?",), "qwen35", False),
    (("peer/*",), "peer/model", True),
    (("[ab]*",), "beta", True),
])
def test_a_keys_model_globs(globs, model, allowed):
    assert KeyScope(models=globs).allows_model(model) is allowed


def test_globs_are_written_one_per_line_or_separated_by_commas_or_spaces():
    assert globs_from_text("qwen*\n  llama-?, embed\r\n\n") == ("qwen*", "llama-?", "embed")


def test_a_bracket_set_is_one_glob_with_the_separators_inside_it():
    assert globs_from_text("qwen[3,4], x[a b]\n[unclosed,y") == ("qwen[3,4]", "x[a b]", "[unclosed", "y")
    assert KeyScope(models=globs_from_text("qwen[3,4]")).allows_model("qwen4")


@given(asked=st.none() | priorities, most=st.none() | priorities, default=st.none() | priorities)
def test_the_applied_priority_is_the_asked_one_or_the_default_never_above_the_maximum(asked, most, default):
    applied = KeyScope(max_priority=most, default_priority=default).applied_priority(asked)
    wanted = (default or 0) if asked is None else asked
    assert applied == (wanted if most is None else min(wanted, most))
    if most is not None:
        assert applied <= most


def test_an_unrestricted_key_passes_the_header_unchanged():
    assert UNRESTRICTED.applied_priority(100) == 100 and UNRESTRICTED.applied_priority(None) == 0


# -- who it is -----------------------------------------------------------------------------------------------

def test_without_any_key_everyone_is_let_in_as_an_operator():
    assert identify({}, [], KeyRows({}, 0), NOW) == OPEN


def test_a_row_key_is_identified_with_its_scope_wherever_it_is_shown():
    secret, scope = new_secret(), KeyScope(name="alice", models=("qwen*",))
    rows = rows_of((secret, scope, True, None))
    basic = base64.b64encode(f"user:{secret}".encode()).decode()
    assert identify(bearer(secret), [], rows, NOW) == Caller(scope)
    assert identify({"x-api-key": secret}, [], rows, NOW) == Caller(scope)
    assert identify({"authorization": f"Basic {basic}"}, [], rows, NOW) == Caller(scope, basic_only=True)


def test_a_config_key_is_unrestricted_beside_row_keys():
    rows = rows_of((new_secret(), KeyScope(name="alice"), True, None))
    assert identify(bearer("sk-config"), ["sk-config"], rows, NOW) == Caller(UNRESTRICTED)


def test_a_revoked_table_still_guards_every_route():
    """A table that had a key keeps requiring one when all its keys are revoked."""
    rows = rows_of((new_secret(), KeyScope(name="alice"), False, None))
    denied = identify({}, [], rows, NOW)
    assert isinstance(denied, Denied) and denied.status == 401


@pytest.mark.parametrize("enabled, expires_at, reason", [
    (False, None, "revoked"),
    (True, NOW, "expired"),
    (True, NOW - timedelta(seconds=1), "expired"),
])
def test_a_revoked_or_expired_key_is_refused_saying_so(enabled, expires_at, reason):
    secret = new_secret()
    denied = identify(bearer(secret), [], rows_of((secret, KeyScope(name="alice"), enabled, expires_at)), NOW)
    assert isinstance(denied, Denied) and denied.status == 401 and reason in denied.message and "alice" in denied.message
    assert secret not in denied.message


def test_a_key_that_expires_later_still_counts():
    secret = new_secret()
    rows = rows_of((secret, KeyScope(name="alice"), True, NOW + timedelta(seconds=1)))
    assert isinstance(identify(bearer(secret), [], rows, NOW), Caller)


def test_a_wrong_secret_with_a_known_prefix_is_refused():
    secret = new_secret()
    rows = rows_of((secret, KeyScope(name="alice"), True, None))
    forged = secret[:PREFIX_LENGTH] + "A" * (len(secret) - PREFIX_LENGTH)
    denied = identify(bearer(forged), [], rows, NOW)
    assert isinstance(denied, Denied) and denied.status == 401 and "alice" not in denied.message


def test_unreadable_rows_refuse_a_row_key_and_an_open_server_but_not_a_config_key():
    """The database is away and the last good read too old: nothing is let through on a guess."""
    assert identify(bearer(new_secret()), [], None, NOW).status == 503
    assert identify({}, [], None, NOW).status == 503
    assert identify(bearer(new_secret()), ["sk-config"], None, NOW).status == 503
    assert identify({}, ["sk-config"], None, NOW).status == 401
    assert identify(bearer("sk-config"), ["sk-config"], None, NOW) == Caller(UNRESTRICTED)


secret_texts = st.text(st.characters(codec="utf-8"), max_size=20) | st.builds(lambda: new_secret())


@given(keys=st.lists(st.tuples(st.builds(lambda: new_secret()), st.booleans(), st.sampled_from([None, -1, 1])),
                     max_size=4),
       config=st.lists(secret_texts.filter(bool), max_size=2), presented=st.lists(secret_texts, max_size=1),
       shown_row=st.integers(0, 3))
def test_only_a_config_key_or_an_enabled_unexpired_row_key_is_admitted(keys, config, presented, shown_row):
    """Whatever is shown, a request is admitted exactly when it shows a config key or the secret of a row that is
    enabled and not expired, and then with that key's scope."""
    table = [(secret, KeyScope(name=f"k{i}"), enabled, None if offset is None else NOW + timedelta(seconds=offset))
             for i, (secret, enabled, offset) in enumerate(keys)]
    if table:  # one row's secret, as the x-api-key or the Bearer token
        presented.insert(shown_row % (len(presented) + 1), table[shown_row % len(table)][0])
    rows = rows_of(*table)
    headers = {"x-api-key": presented[0]} if presented else {}
    if len(presented) > 1:
        headers["authorization"] = f"Bearer {presented[1]}"
    shown = presented_keys(headers)
    found = identify(headers, config, rows, NOW)
    good = {secret: scope for secret, scope, enabled, expires in table if enabled and (expires is None or expires > NOW)}
    admitted = [UNRESTRICTED if key in config else good[key] for key in shown if key in config or key in good]
    if not config and not table:
        assert found == OPEN
    elif admitted:
        assert isinstance(found, Caller) and found.scope == admitted[0]
    else:
        assert isinstance(found, Denied) and found.status == 401


# -- what it may do --------------------------------------------------------------------------------------------

def test_only_an_operator_key_does_operators_work():
    plain, operator = Caller(KeyScope(name="app")), Caller(KeyScope(name="ops", operator=True))
    denied = route_refusal(plain, Need.OPERATOR)
    assert denied.status == 403 and "'app'" in denied.message
    assert route_refusal(operator, Need.OPERATOR) is None and route_refusal(OPEN, Need.OPERATOR) is None
    assert route_refusal(plain, Need.INFERENCE) is None and route_refusal(plain, Need.READ) is None


def test_a_read_only_key_reads_and_sends_no_inference():
    reader = Caller(KeyScope(name="dash", read_only=True))
    assert route_refusal(reader, Need.READ) is None
    denied = route_refusal(reader, Need.INFERENCE)
    assert denied.status == 403 and "read-only" in denied.message
    assert route_refusal(reader, Need.OPERATOR).status == 403


def test_a_model_outside_the_keys_globs_is_refused_naming_key_and_model():
    denied = model_refusal(Caller(KeyScope(name="alice", models=("qwen*",))), "llama")
    assert denied.status == 403 and "'alice'" in denied.message and "'llama'" in denied.message
    assert model_refusal(Caller(KeyScope(name="alice", models=("qwen*",))), "qwen3") is None


def test_a_cross_site_change_is_refused_only_for_a_key_shown_as_basic_alone():
    page = {"origin": "https://evil.example", "host": "127.0.0.1:8080"}
    scope = KeyScope(name="ops", operator=True)
    assert cross_site_refusal(page, Caller(scope, basic_only=True)) is not None
    assert cross_site_refusal(page, Caller(scope)) is None
    assert cross_site_refusal(page, OPEN) is None


def test_the_servers_own_cookies_are_taken_out_of_each_cookie_header_by_their_configured_names(settings):
    settings.SESSION_COOKIE_NAME, settings.CSRF_COOKIE_NAME = "ls_session", "ls_csrf"
    headers = [("Cookie", "ls_session=s; theme=dark;ls_csrf=c"), ("cookie", "ls_csrf=c"), ("accept", "*/*"),
               ("cookie", "sessionid=not-ours")]
    assert without_own_cookies(headers) == [("Cookie", "theme=dark"), ("accept", "*/*"), ("cookie", "sessionid=not-ours")]
