"""A key's usage page in the admin: its requests, tokens, queue waits and error statuses over a window."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

import pytest
from django.urls import reverse

from scheduling.keys.store import make_key
from scheduling.models import ApiKey

pytestmark = pytest.mark.django_db

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=timezone.utc)
WINDOW = {"since": "2025-03-01T12:00", "until": "2025-03-01T13:00"}  # 60 one-minute buckets


@pytest.fixture
def chat(make_request):
    key = ApiKey(name="chat-app")
    make_key(key)
    at = T0 + timedelta(minutes=10)
    make_request(id=1, api_key="chat-app", arrived_at=at, dispatched_at=at + timedelta(seconds=2), status_code=200,
                 input_tokens=30, output_tokens=100)
    make_request(id=2, api_key="chat-app", arrived_at=at + timedelta(seconds=5),
                 dispatched_at=at + timedelta(seconds=9), status_code=200, input_tokens=12, output_tokens=8)
    make_request(id=3, api_key="chat-app", arrived_at=at + timedelta(minutes=20), state="rejected", status_code=429)
    make_request(id=4, api_key="chat-app", arrived_at=at + timedelta(minutes=21), state="rejected", status_code=503)
    make_request(id=5, api_key="other", arrived_at=at, status_code=500, input_tokens=999)  # another key's
    make_request(id=6, api_key="chat-app", arrived_at=T0 + timedelta(hours=2), status_code=429)  # after the window
    return key


def usage_url(key) -> str:
    return reverse("admin:scheduling_apikey_usage", args=[key.pk])


def test_the_page_counts_the_keys_requests_tokens_and_errors_in_the_window(admin_client, chat):
    from scheduling.operating import key_usage, overview

    page = admin_client.get(usage_url(chat), WINDOW)
    assert page.status_code == 200
    text = page.content.decode()
    assert re.search(r'id="usage-requests">4<', text) and "42 in / 108 out" in text
    assert re.search(r'id="usage-errors">2<', text)
    assert [chart["title"] for chart in page.context["charts"]] == [
        "Requests", "Tokens", "Queue wait", "Refusals and errors by status"]
    assert text.count('<svg class="chart"') == 4 and "?api_key=chat-app" in text

    window, _ = overview.chosen_window(WINDOW, T0)
    usage = key_usage.summarize("chat-app", window)
    assert usage.requests[10] == 2 and usage.requests[30] == 1 and usage.requests[31] == 1 and sum(usage.requests) == 4
    assert (usage.input_tokens[10], usage.output_tokens[10]) == (42, 108)
    # Waits of 2 s and 4 s: the median is the bin holding 2 s, the 95th percentile the one holding 4 s.
    assert usage.wait_p50_s[10] == 2.0 and usage.wait_p95_s[10] == 4.0 and usage.wait_p50_s[30] is None
    assert usage.statuses == {"429": [1 if b == 30 else 0 for b in range(60)],
                              "503": [1 if b == 31 else 0 for b in range(60)]}


def test_the_key_list_and_page_link_to_it_and_a_bad_window_says_why(admin_client, chat):
    assert usage_url(chat) in admin_client.get(reverse("admin:scheduling_apikey_changelist")).content.decode()
    assert usage_url(chat) in admin_client.get(reverse("admin:scheduling_apikey_change", args=[chat.pk])).content.decode()
    bad = admin_client.get(usage_url(chat), {"window": "2y"})
    assert bad.status_code == 400 and "is not one of" in bad.content.decode()
    assert admin_client.get(reverse("admin:scheduling_apikey_usage", args=[chat.pk + 100])).status_code == 404


def test_staff_who_may_not_read_the_history_do_not_see_it(client, chat, django_user_model):
    from django.contrib.auth.models import Permission

    staff = django_user_model.objects.create_user("bob", password="x", is_staff=True)
    staff.user_permissions.add(Permission.objects.get(codename="view_apikey"))
    client.force_login(staff)
    assert client.get(usage_url(chat)).status_code == 403


def test_refusals_at_the_door_are_added_to_the_statuses_of_their_minute(chat):
    from collections import Counter

    from scheduling.keys.refusals import write_refusals
    from scheduling.operating import key_usage, overview

    at = T0 + timedelta(minutes=30, seconds=40)
    write_refusals(Counter({("chat-app", at.replace(second=0), 429): 3, ("chat-app", at.replace(second=0), 403): 1,
                            ("other", at.replace(second=0), 429): 9}))
    write_refusals(Counter({("chat-app", at.replace(second=0), 429): 2}))  # another front end's: added to
    window, _ = overview.chosen_window(WINDOW, T0)
    usage = key_usage.summarize("chat-app", window)
    assert usage.statuses["429"][30] == 1 + 5 and usage.statuses["403"][30] == 1
    assert usage.totals["errors"] == 2 + 6


def test_the_keys_page_takes_a_priority_alias_as_the_command_does(admin_client, chat):
    url = reverse("admin:scheduling_apikey_change", args=[chat.pk])
    form = {"enabled": "on", "allowed_models": "", "max_priority": "interactive", "default_priority": "-98",
            "expires_at_0": "", "expires_at_1": "", "rpm": "", "tpm": "", "concurrency": "", "weight": "1"}
    saved = admin_client.post(url, form)
    assert saved.status_code == 302, saved.content.decode()[:2000]
    chat.refresh_from_db()
    assert (chat.max_priority, chat.default_priority) == (100, -98)
    refused = admin_client.post(url, {**form, "max_priority": "urgent"})
    assert refused.status_code == 200 and "&#x27;urgent&#x27; is not a priority" in refused.content.decode()
