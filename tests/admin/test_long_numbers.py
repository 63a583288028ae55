"""Whole numbers in requests past what the database holds (64 bits) or int() reads (4300 digits):
the caller is told, never answered 500."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from django import forms
from django.test import RequestFactory

from scheduling.admin.site import _selected_tickets
from scheduling.admin.forms import PriorityField, SlotsField
from scheduling.whole_numbers import ROW_ID_MAX, as_typed, whole_number

pytestmark = pytest.mark.django_db

HUGE = "9" * 5000


@pytest.fixture
def config(monkeypatch):
    config = SimpleNamespace(api_keys=[], capture_buffer_mb=1)
    monkeypatch.setattr("proxy.api.views.get_service", lambda: SimpleNamespace(config=config))
    return config


@pytest.mark.parametrize("text, number", [("0", 0), ("007", 7), (str(ROW_ID_MAX), ROW_ID_MAX),
                                          (str(ROW_ID_MAX + 1), None), (HUGE, None), ("0" * 5000 + "5", 5),
                                          ("-1", None), ("١٢", None), ("1_0", None), ("", None)])
def test_a_whole_number_is_read_only_within_its_bound(text, number):
    assert whole_number(text) == number


def test_long_text_is_cut_in_messages():
    assert as_typed("abc") == "abc"
    assert as_typed(HUGE) == "9" * 20 + "… (5000 characters)"


@pytest.mark.parametrize("capture_id", ["9" * 4301, str(ROW_ID_MAX + 1)])
def test_a_capture_id_no_request_can_have_is_not_found(client, config, capture_id):
    response = client.get(f"/api/captures/{capture_id}")
    assert response.status_code == 404, response.content
    assert f"ids stop at {ROW_ID_MAX}" in response.json()["error"]["message"]


@pytest.mark.parametrize("method, url", [("get", "/api/queue/{}"), ("delete", "/api/queue/{}"),
                                         ("post", "/api/inflight/{}/cancel")])
def test_a_queue_id_past_64_bits_is_not_found(client, config, method, url):
    response = getattr(client, method)(url.format("9" * 4000))
    assert response.status_code == 404, response.content
    assert response.json()["error"]["code"] == "request_not_found"


def test_ticket_checkboxes_that_cannot_be_ids_are_left_out():
    request = RequestFactory().post("/", {"ticket": ["3", HUGE, str(ROW_ID_MAX + 1), "x", "1"]})
    assert _selected_tickets(request) == [1, 3]


@pytest.mark.parametrize("text", [HUGE, "-" + HUGE, str(ROW_ID_MAX + 1)])
def test_a_priority_past_64_bits_is_refused_with_a_message(text):
    with pytest.raises(forms.ValidationError, match="is not a priority"):
        PriorityField().clean(text)


def test_a_priority_at_the_64_bit_limits_is_taken():
    assert PriorityField().clean(str(ROW_ID_MAX)) == ROW_ID_MAX
    assert PriorityField().clean(str(-ROW_ID_MAX - 1)) == -ROW_ID_MAX - 1


def test_a_slot_count_too_long_for_int_reads_as_a_number_out_of_range():
    assert SlotsField().clean(f"chat: {HUGE}\nembed: 2") == {"chat": float("inf"), "embed": 2}
