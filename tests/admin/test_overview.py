"""The admin's Overview: its numbers on a small known history, its windows, who may see it, and its cost."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

import pytest
from django.contrib.auth.models import Permission, User
from django.urls import reverse

from scheduling.operating.overview import BadWindow, Window, summarize
from scheduling.operating.svg_charts import Chart, Series, nice_ticks, readable, render, tick_labels

pytestmark = pytest.mark.django_db

URL = reverse("admin-overview")
T0 = datetime(2025, 3, 1, 12, 0, tzinfo=timezone.utc)
HOUR = {"since": "2025-03-01T12:00:00Z", "until": "2025-03-01T13:00:00Z"}


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


@pytest.fixture
def history(make_request):
    """One hour from 12:00 in one-minute buckets, with a request waiting into it and a job running into it."""
    # Arrived before the window, waiting until 12:00:30, then ran on beta until 12:01:30 (a load).
    make_request(id=1, band="batch", model="beta", arrived_at=at(-90), dispatched_at=at(30), finished_at=at(90),
                 needed_swap=True)
    # Bucket 0: an interactive request waits 4 s and runs 30 s on alpha, loading it.
    make_request(id=2, band="interactive", arrived_at=at(0), dispatched_at=at(4), finished_at=at(34),
                 needed_swap=True)
    # Bucket 0: a normal one waits 30 s (aging changed the pick), runs on alpha from 12:00:40 to 12:01:10.
    make_request(id=3, band="normal", arrived_at=at(10), dispatched_at=at(40), finished_at=at(70),
                 changed_by_aging=True)
    # Bucket 5: an interactive one waits 2 s (swap affinity changed the pick) and runs 6 s.
    make_request(id=4, band="interactive", arrived_at=at(300), dispatched_at=at(302), finished_at=at(308),
                 changed_by_affinity=True)
    # Cancelled after 20 s in the queue in bucket 10: counts in the depth, never dispatched.
    make_request(id=5, band="normal", state="cancelled", arrived_at=at(600), finished_at=at(620))
    # Outside the window on both sides.
    make_request(id=6, band="normal", arrived_at=at(-3 * 86400), dispatched_at=at(-3 * 86400 + 1),
                 finished_at=at(-3 * 86400 + 2))
    make_request(id=7, band="normal", arrived_at=at(3600), dispatched_at=at(3601), finished_at=at(3602))


def hour() -> Window:
    return Window.from_query(HOUR, now=T0)


def test_a_window_of_an_hour_has_sixty_one_minute_buckets():
    window = hour()
    assert (window.since, window.until, window.step) == (T0, T0 + timedelta(hours=1), timedelta(minutes=1))
    assert len(window.starts) == 60 and window.lengths_ms() == [60_000] * 60


def test_dispatches_reorders_and_loads_fall_in_their_buckets(history):
    summary = summarize(hour())
    assert summary.dispatches_per_h[:2] == [3 * 60, 0]  # #1, #2, #3 in the first minute: 180 an hour
    assert summary.dispatches_per_h[5] == 60
    assert sum(summary.dispatches_per_h) == 4 * 60
    assert summary.reorders_per_h["aging"][0] == 60 and sum(summary.reorders_per_h["aging"]) == 60
    assert summary.reorders_per_h["swap affinity"][5] == 60 and sum(summary.reorders_per_h["swap affinity"]) == 60
    assert summary.loads == {"alpha": [1] + [0] * 59, "beta": [1] + [0] * 59}


def test_waits_are_read_from_the_histogram(history):
    summary = summarize(hour())
    assert summary.wait_p50_s["interactive"][0] == 4.0
    assert summary.wait_p50_s["interactive"][5] == 2.0
    assert summary.wait_p50_s["normal"][0] == 30.0
    assert summary.wait_p50_s["batch"][0] == 120.0  # waited 2 min, from before the window
    assert summary.wait_p50_s["interactive"][1] is None  # nobody dispatched in the second minute
    totals = {row["band"]: row for row in summary.totals}
    assert totals["interactive"] == {"band": "interactive", "arrived": 2, "dispatched": 2, "p50_s": 2.0, "p95_s": 4.0}
    assert totals["normal"]["arrived"] == 2 and totals["normal"]["dispatched"] == 1
    assert totals["batch"]["arrived"] == 0 and totals["batch"]["dispatched"] == 1


def test_queue_depth_and_busy_share_are_averages_over_each_bucket(history):
    summary = summarize(hour())
    # Minute 0: #1 waits 30 s, #2 waits 4 s, #3 waits 30 s.
    assert summary.depth["batch"][0] == pytest.approx(30 / 60)
    assert summary.depth["interactive"][0] == pytest.approx(4 / 60)
    assert summary.depth["normal"][0] == pytest.approx(30 / 60)
    assert summary.depth["normal"][10] == pytest.approx(20 / 60)
    assert summary.depth["normal"][11] == 0
    # alpha: #2 for 30 s and #3 for 20 s in minute 0, #3 for 10 s in minute 1; beta: #1 30 s, then 30 s.
    assert summary.busy_share["alpha"][:2] == [pytest.approx(50 / 60), pytest.approx(10 / 60)]
    assert summary.busy_share["alpha"][5] == pytest.approx(6 / 60)
    assert summary.busy_share["beta"][:3] == [pytest.approx(0.5), pytest.approx(0.5), 0]


def test_the_overview_page_draws_the_charts_and_the_totals(admin_client, history):
    response = admin_client.get(URL, HOUR)
    page = response.content.decode()
    assert response.status_code == 200
    assert page.count('<svg class="chart"') == 5
    for title in ("Queue depth by band", "Queue wait by band", "Dispatches and reorders per hour", "Model loads",
                  "GPU busy share"):
        assert f"<h2>{title}</h2>" in page
    assert "Mar 01 12:00–12:01 · interactive p50: 4 s" in page
    assert "Mar 01 12:00–12:01 · dispatches: 180/h" in page
    assert "Mar 01 12:00–12:01 · alpha: 83.3%" in page
    assert "in buckets of 1 min" in page
    assert re.search(r'<tr id="total-interactive">.*?<td class="p95">≤ 4.0 s</td>', page, re.S)


def test_an_empty_window_draws_empty_charts(admin_client):
    page = admin_client.get(URL, HOUR).content.decode()
    assert page.count('<svg class="chart"') == 5
    assert page.count("none in this window") == 2  # no model loads, no model busy
    assert '<td class="p50">—</td>' in page


@pytest.mark.parametrize("window,step", [("1h", "1 min"), ("24h", "30 min"), ("7d", "3 h"), ("30d", "12 h")])
def test_each_preset_window_renders(admin_client, history, window, step):
    page = admin_client.get(URL, {"window": window}).content.decode()
    assert f"in buckets of {step}" in page and f"<strong>{window}</strong>" in page
    assert page.count('<svg class="chart"') == 5


@pytest.mark.parametrize("query,message", [
    ({"window": "5y"}, "window: &#x27;5y&#x27; is not one of 1h, 24h, 7d, 30d."),
    ({"since": "yesterday"}, "since: &#x27;yesterday&#x27; is not a date or a date and time"),
    ({"since": "2025-02-30"}, "since: &#x27;2025-02-30&#x27; is not a date"),
    ({"since": "2025-03-02", "until": "2025-03-01"}, "until (2025-03-01) must be after since (2025-03-02)."),
    ({"until": "2025-03-01"}, "until needs a since"),
    ({"since": "2020-01-01", "until": "2025-01-01"}, "The window is at most 366 days"),
    ({"since": "0001-01-01", "until": "0001-01-02"}, "since: &#x27;0001-01-01&#x27; is outside 1971 to 9998."),
    ({"since": "9999-12-31T23:00:00-05:00", "until": "9999-12-31T23:30:00-05:00"}, "is outside 1971 to 9998."),
])
def test_a_bad_window_is_refused_with_a_clear_message(admin_client, query, message):
    response = admin_client.get(URL, query)
    assert response.status_code == 400
    assert message in response.content.decode()


def test_a_naive_since_is_in_the_admin_time_zone_and_until_defaults_to_now():
    now = datetime(2025, 3, 1, 12, 34, 56, tzinfo=timezone.utc)
    window = Window.from_query({"since": "2025-03-01 12:00"}, now=now)
    assert (window.since, window.until, window.step) == (T0, now, timedelta(minutes=1))
    assert window.lengths_ms()[-1] == 56_000  # the last bucket ends at now
    with pytest.raises(BadWindow):
        Window.from_query({"since": "2025-03-01T13:00"}, now=now)


def test_the_overview_is_for_staff_who_may_see_the_history(client, history):
    assert client.get(URL).status_code == 302  # to the login page
    member = User.objects.create_user("member", password="pw")
    client.force_login(member)
    assert client.get(URL)["Location"].startswith("/admin/login/")
    staff = User.objects.create_user("staff", password="pw", is_staff=True)
    client.force_login(staff)
    assert client.get(URL).status_code == 403
    assert "overview-entry" not in client.get(reverse("admin:index")).content.decode()
    staff.user_permissions.add(Permission.objects.get(codename="view_queuedrequest"))
    assert client.get(URL).status_code == 200


def test_the_index_leads_with_the_overview_and_says_llamaswap(admin_client):
    page = admin_client.get(reverse("admin:index")).content.decode()
    assert page.index(f'href="{URL}"') < page.index(reverse("admin:scheduling_queuedrequest_changelist"))
    assert "<title>llamaswap administration | llamaswap admin</title>" in page
    assert '<a href="/admin/">llamaswap</a>' in page
    assert "Django" not in page


def test_the_page_costs_a_fixed_number_of_queries(admin_client, make_request, django_assert_max_num_queries):
    for n in range(1, 200):
        make_request(id=n, model=f"m{n % 7}", arrived_at=at(n * 17), dispatched_at=at(n * 17 + n % 9),
                     finished_at=at(n * 17 + 30), needed_swap=n % 3 == 0)
    with django_assert_max_num_queries(3):  # the session, the user, and the one aggregating statement
        assert admin_client.get(URL, HOUR).status_code == 200


def test_the_svg_helpers_pick_round_ticks_and_readable_numbers():
    assert nice_ticks(0) == [0.0, 1.0]
    assert nice_ticks(7) == [0.0, 2.0, 4.0, 6.0, 8.0]
    assert nice_ticks(180) == [0.0, 50.0, 100.0, 150.0, 200.0]
    assert nice_ticks(0.3) == [0.0, 0.1, 0.2, 0.3]
    assert [readable(v) for v in (1234.5, 83.333, 4.0, 0.25, 0.004, None)] == ["1,234", "83.3", "4", "0.25", "0.004", "—"]


def test_axis_labels_never_repeat_a_value():
    """Ticks 0.005 apart read 0.005, 0.01, 0.015: rounded to two decimals, 0.01 and 0.015 both read "0.01"."""
    for top in (0.012, 0.0004, 1.3, 7, 1234):
        svg = render(Chart("t", ["12:00", "12:01"], ["a", "b"], [Series("s", [top, 0.0])], unit=" s"))
        labels = re.findall(r'text-anchor="end" fill="currentColor">([^<]*)</text>', svg)
        assert len(labels) == len(set(labels)) == len(nice_ticks(top)), labels
    assert tick_labels(nice_ticks(0.012)) == ["0", "0.005", "0.01", "0.015"]
    assert tick_labels(nice_ticks(1234)) == ["0", "500", "1,000", "1,500"]


def test_the_since_and_until_boxes_show_the_window_the_page_draws(admin_client):
    """A since between bucket starts draws from the bucket's start (09:05 in buckets of 5 min), and a time in
    another zone is drawn in the admin's: the boxes say so, so sending them again draws the same window."""
    page = admin_client.get(URL, {"since": "2025-03-01T09:07", "until": "2025-03-01T08:00:30-05:00"}).content.decode()
    assert "in buckets of 5 min" in page
    assert 'name="since" id="id_since" value="2025-03-01T09:05"' in page
    assert 'name="until" id="id_until" value="2025-03-01T13:00:30"' in page
    assert "From March 1, 2025, 9:05 a.m. to March 1, 2025, 1 p.m." in page
    preset = admin_client.get(URL, {"window": "1h"}).content.decode()
    since = re.search(r'name="since" id="id_since" value="([^"]+)"', preset).group(1)
    now = datetime.now(timezone.utc)
    assert now - timedelta(hours=1, minutes=2) < datetime.fromisoformat(since).replace(tzinfo=timezone.utc) <= now
    assert 'name="until" id="id_until" value=""' in preset  # until is now
    assert 'value="yesterday"' in admin_client.get(URL, {"since": "yesterday"}).content.decode()  # refused: as typed


def test_times_count_to_the_millisecond_at_the_window_s_end(make_request):
    make_request(id=1, arrived_at=at(3599.999), dispatched_at=at(3599.999), finished_at=at(3599.999))
    make_request(id=2, arrived_at=at(3599.9996), dispatched_at=at(3599.9997), finished_at=at(3599.9999))
    summary = summarize(hour())  # the second rounds to 13:00:00.000: after the window
    assert summary.dispatches_per_h[-1] == 60 and summary.totals[1]["arrived"] == 1


def test_names_in_a_chart_are_escaped():
    svg = render(Chart("a <b> & c", ["12:00"], ["12:00–12:01"], [Series("<model>", [1.0])], stacked_bars=True))
    assert "<model>" not in svg and "<b>" not in svg
    assert "&lt;model&gt;" in svg and "<title>12:00–12:01 · &lt;model&gt;: 1</title>" in svg
