"""The request history in the admin: read-only, filterable, explained, and cheap on a big table."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from scheduling.rows.history import CappedCountPaginator
from scheduling.models import QueuedRequest
from tests.admin.rows import dispatched

pytestmark = pytest.mark.django_db

LIST_URL = reverse("admin:scheduling_queuedrequest_changelist")
T0 = datetime(2025, 3, 1, 12, 0, tzinfo=timezone.utc)


def detail_url(ticket_id):
    return reverse("admin:scheduling_queuedrequest_change", args=[ticket_id])


def listed_ids(response) -> list[int]:
    return [row.id for row in response.context["cl"].result_list]


@pytest.fixture
def history(make_request):
    make_request(id=811, model="beta", **dispatched(T0, score=(0, 10, 2.0), explanation="dispatched at score 12.0"))
    make_request(id=812, model="alpha", state="cancelled", band="batch", priority=-100,
                 arrived_at=datetime(2025, 3, 2, 8, 0, tzinfo=timezone.utc),
                 finished_at=datetime(2025, 3, 2, 8, 1, tzinfo=timezone.utc), error="client disconnected while queued")
    make_request(
        id=813, model="alpha",
        **dispatched(
            datetime(2025, 3, 3, 9, 0, tzinfo=timezone.utc), wait_s=4.2, score=(100, 0, 4.2),
            runner_up_id=812, runner_up_score=92.0, changed_by_aging=True, changed_by_affinity=False,
            needed_swap=True, slot=1, waited_because="reserved for #812's swap to alpha", input_tokens=12, cache_tokens=3, output_tokens=200, tokens_per_second=45.2,
            explanation="dispatched at score 104.2 = 100 priority + 0 affinity + 4.2 aging, ahead of #812 at 92.0; "
                        "aging changed the pick",
        ),
    )


def test_the_history_lists_newest_first_and_filters_by_state_band_model_and_date(admin_client, history, config_file):
    assert listed_ids(admin_client.get(LIST_URL)) == [813, 812, 811]
    assert listed_ids(admin_client.get(LIST_URL, {"state": "cancelled"})) == [812]
    assert listed_ids(admin_client.get(LIST_URL, {"band": "interactive"})) == [813]
    assert listed_ids(admin_client.get(LIST_URL, {"model": "beta"})) == [811]
    day = {"arrived_at__gte": "2025-03-02 00:00:00+00:00", "arrived_at__lt": "2025-03-03 00:00:00+00:00"}
    assert listed_ids(admin_client.get(LIST_URL, day)) == [812]
    drill_down = {"arrived_at__year": 2025, "arrived_at__month": 3, "arrived_at__day": 3}
    assert listed_ids(admin_client.get(LIST_URL, drill_down)) == [813]


def test_the_model_filter_offers_the_configured_models(admin_client, history, config_file):
    page = admin_client.get(LIST_URL).content.decode()
    assert "?model=alpha" in page and "?model=beta" in page


def test_search_finds_an_exact_id_or_a_model_prefix_and_shrugs_at_words(admin_client, history, config_file):
    assert listed_ids(admin_client.get(LIST_URL, {"q": "812"})) == [812]
    assert listed_ids(admin_client.get(LIST_URL, {"q": "bet"})) == [811]
    assert listed_ids(admin_client.get(LIST_URL, {"q": "nothing-like-this"})) == []


def test_the_detail_page_explains_the_decision_in_words(admin_client, history, config_file):
    page = admin_client.get(detail_url(813)).content.decode()
    assert ("Dispatched at score 104.2 = 100 priority + 0 affinity + 4.2 aging, ahead of #812 at 92.0; "
            "aging changed the pick.") in page
    assert ("waited 4.2 s in the queue (reserved for #812&#x27;s swap to alpha); ran on slot 1 of alpha; "
            "its model had to be started; ran 2.0 s") in page
    assert "12 in (3 from cache), 200 out at 45.2 tokens/s" in page
    assert f'<a href="{detail_url(812)}">#812</a> at score 92.0' in page


def test_a_request_that_never_ran_says_why(admin_client, history, config_file):
    page = admin_client.get(detail_url(812)).content.decode()
    assert "Never dispatched — cancelled: client disconnected while queued." in page
    assert "left the queue after 60.0 s" in page


def test_the_history_is_read_only_and_only_superusers_may_delete(client, admin_client, history, config_file):
    viewer = User.objects.create_user("viewer", password="pw", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_queuedrequest"))
    client.force_login(viewer)
    assert client.get(LIST_URL).status_code == 200
    page = client.get(detail_url(813)).content.decode()
    assert "Dispatched at score 104.2" in page and 'name="model"' not in page
    assert client.post(detail_url(813), {"model": "changed"}).status_code == 403
    assert client.post(reverse("admin:scheduling_queuedrequest_delete", args=[813]), {"post": "yes"}).status_code == 403
    assert client.get(reverse("admin:scheduling_queuedrequest_add")).status_code == 403
    assert QueuedRequest.objects.get(id=813).model == "alpha"

    admin_client.post(reverse("admin:scheduling_queuedrequest_delete", args=[813]), {"post": "yes"})
    assert not QueuedRequest.objects.filter(id=813).exists()


def test_listing_never_counts_the_whole_table(admin_client, make_request, config_file, monkeypatch):
    monkeypatch.setattr(CappedCountPaginator, "cap", 5)
    for ticket_id in range(1, 9):
        make_request(id=ticket_id)
    with CaptureQueriesContext(connection) as queries:
        response = admin_client.get(LIST_URL, {"state": "completed"})
    counts = [q["sql"] for q in queries.captured_queries if "COUNT(" in q["sql"].upper()]
    assert counts and all("LIMIT" in sql.upper() for sql in counts), counts
    assert "More than 5 requests" in response.content.decode()


def test_only_indexed_columns_can_be_sorted(admin_client, history, config_file):
    response = admin_client.get(LIST_URL, {"o": "3"})  # the model column
    assert listed_ids(response) == [813, 812, 811]
    assert listed_ids(admin_client.get(LIST_URL, {"o": "2"})) == [811, 812, 813]  # arrived_at, ascending
