"""The settings page's Preview: validated as Save is, the replay's comparison shown, nothing saved or audited."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.admin.models import LogEntry
from django.urls import reverse
from django.utils import timezone

from scheduling.models import QueuedRequest, SchedulerSettings, SettingsChange

pytestmark = pytest.mark.django_db

CHANGE_URL = reverse("admin:scheduling_schedulersettings_change", args=[1])


def post(client, button, aging="", bonus="", slots="", **extra):
    return client.post(CHANGE_URL, {"aging_divisor": aging, "swap_affinity_bonus": bonus, "slots": slots,
                                    button: button, **extra})


def recorded(ago: timedelta):
    """alpha loads in 2 s for a 10 s batch job; a normal beta request and a normal alpha request wait behind it.
    With swapAffinityBonus 5 the later alpha request goes first (its model is up); times from now − `ago`."""
    start = timezone.now() - ago
    at = lambda s: start + timedelta(seconds=s)  # noqa: E731

    def row(ticket_id, model, priority, arrived, sent, decided, ran, swap):
        QueuedRequest.objects.create(
            id=ticket_id, model=model, path="/v1/chat/completions", route="chat", priority=priority,
            state="completed", arrived_at=at(arrived), dispatched_at=at(sent), needed_swap=swap,
            serial_queue_wait_ms=round((decided - arrived) * 1000), duration_ms=round(ran * 1000),
            finished_at=at(sent + ran))

    row(1, "alpha", -100, 0, sent=2, decided=0, ran=10, swap=True)
    row(2, "beta", 0, 3, sent=16, decided=13, ran=1, swap=True)
    row(3, "alpha", 0, 4, sent=12, decided=12, ran=1, swap=False)


def errors(response) -> list[str]:
    return re.findall(r'<ul class="errorlist[^"]*"[^>]*>.*?</ul>', response.content.decode(), re.S)


def test_a_preview_shows_both_runs_and_the_chart_and_saves_nothing(admin_client, config_file):
    recorded(timedelta(minutes=30))
    response = post(admin_client, "_preview", bonus="0")
    page = response.content.decode()
    assert response.status_code == 200
    assert 'id="settings-preview"' in page and "Replay of 3 requests" in page
    table = page[page.index('id="preview-table"'):page.index("</table>", page.index('id="preview-table"'))]
    assert "swapAffinityBonus=5" in table and "swapAffinityBonus=0" in table
    assert "normal wait p50/p95/max s" in table and "swaps (model loads)" in table and "GPU busy share" in table
    assert "picks affinity changed" in table
    assert '<svg class="chart"' in page and "Wait by band, in force and proposed" in page
    assert "Requests whose wait changed most" in page and "Left out: 0 refused for a failed start" in page
    assert "same order" in page  # the fidelity of the settings in force
    assert re.search(r'name="swap_affinity_bonus" value="0"', page)  # the value as typed stays in the form
    assert SchedulerSettings.load().swap_affinity_bonus is None
    assert not SettingsChange.objects.exists() and not LogEntry.objects.exists()


def test_invalid_values_show_the_same_errors_as_save_and_no_preview(admin_client, config_file):
    previewed = post(admin_client, "_preview", aging="-1", bonus="150", slots="nosuch: 2")
    saved = post(admin_client, "_save", aging="-1", bonus="150", slots="nosuch: 2")
    assert previewed.status_code == saved.status_code == 200
    assert len(errors(previewed)) == 3 and errors(previewed) == errors(saved)
    assert 'id="settings-preview"' not in previewed.content.decode()
    assert not SettingsChange.objects.exists() and SchedulerSettings.load().overrides() == {}


def test_an_empty_window_says_there_is_nothing_to_replay(admin_client, config_file):
    page = post(admin_client, "_preview", bonus="0").content.decode()
    assert 'id="preview-empty"' in page and "Nothing to replay" in page and '<svg class="chart"' not in page


def test_the_window_is_chosen_and_kept(admin_client, config_file):
    recorded(timedelta(hours=3))
    last_hour = post(admin_client, "_preview", bonus="0", preview_window="1h").content.decode()
    assert "Nothing to replay: no requests arrived in the last 1h" in last_hour
    assert '<option value="1h" selected>' in last_hour
    default = post(admin_client, "_preview", bonus="0", preview_window="bogus").content.decode()
    assert "Replay of 3 requests that arrived in the last 24h" in default
    week = post(admin_client, "_preview", bonus="0", preview_window="7d").content.decode()
    assert "Replay of 3 requests that arrived in the last 7d" in week


def test_save_still_saves(admin_client, config_file):
    assert post(admin_client, "_save", bonus="0", preview_window="1h").status_code == 302
    assert SchedulerSettings.load().swap_affinity_bonus == 0


def test_grouped_bars_stand_side_by_side_in_their_group_and_skip_gaps():
    from scheduling.operating.svg_charts import Chart, Series, render

    svg = render(Chart("waits", ["normal", "batch"], ["normal", "batch"],
                       [Series("in force", [1.0, None]), Series("proposed", [2.0, 3.0], dashed=True)],
                       grouped_bars=True))
    bars = [(float(x), title) for x, title in re.findall(r'<rect x="([0-9.]+)"[^>]*><title>([^<]*)</title>', svg)]
    assert [title for _, title in bars] == ["normal · in force: 1", "normal · proposed: 2", "batch · proposed: 3"]
    assert bars[0][0] < bars[1][0] < bars[2][0]
    assert svg.count('fill-opacity="0.55"') == 2  # the dashed series' bars are paler
