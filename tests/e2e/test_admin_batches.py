"""The admin's Batches page in a real headless Chromium: a running batch's progress bar and counts, its time
left as the scheduler predicts it, its lines' outcomes, and the cancel button doing what the API's cancel does."""

from __future__ import annotations

import re

import pytest

from tests.admin.session import create_superuser
from tests.e2e.test_admin_browser import browser, log_in  # noqa: F401 - the fixture
from tests.e2e.test_batches import batch_starts, client, config, finished, jsonl, submit
from tests.served import Served, wait_until

pytestmark = pytest.mark.e2e

BATCHES = "/admin/scheduling/batch/"


def test_a_batch_shows_its_progress_and_time_left_and_is_cancelled_from_its_row(tmp_path, browser):  # noqa: F811
    from selenium.webdriver.common.by import By

    events = tmp_path / "events.jsonl"
    with Served(tmp_path, config(events)) as served:
        create_superuser(served, "alice", "correct-horse-battery")
        log_in(browser, served)
        wait_until(lambda: "llamaswap administration" in browser.page_source, what="the admin index")
        api = client(served)
        batch = submit(api, jsonl(40, delay=0.2))
        wait_until(lambda: len(batch_starts(events)) >= 4, 30, what="four lines to end")

        def row():
            browser.get(served.base + BATCHES)
            return next(r for r in browser.find_elements(By.CSS_SELECTOR, "#result_list tbody tr")
                        if batch.id in r.text)

        shown = row()
        bar = shown.find_element(By.TAG_NAME, "progress")
        done = int(bar.get_attribute("value"))
        assert 3 <= done < 40 and bar.get_attribute("max") == "40"
        assert f"{done} done, 0 failed, 40 total" in shown.find_element(By.CLASS_NAME, "counts").text
        # The lines left, one at a time (one slot), at the 0.2 s each the finished ones took: about 7 s.
        left = re.search(r"(\d+) s", shown.find_element(By.CLASS_NAME, "field-time_left").text)
        assert left and 3 <= int(left.group(1)) <= 9, shown.text

        shown.find_element(By.CSS_SELECTOR, "a[href*='batchrequest']").click()
        wait_until(lambda: "line-0" in browser.page_source, what="the batch's lines")
        lines = {cells[2].text: cells[4].text for r in browser.find_elements(By.CSS_SELECTOR, "#result_list tbody tr")
                 if (cells := r.find_elements(By.CSS_SELECTOR, "td, th"))}
        assert lines["line-0"] == "200" and lines["line-39"] == "—"

        row().find_element(By.CLASS_NAME, "cancel-batch").click()
        wait_until(lambda: f"Cancelling {batch.id}" in browser.page_source, what="the cancel to be confirmed")
        ended = finished(api, batch.id)
        assert ended.status == "cancelled" and ended.request_counts.failed > 0
        shown = row()
        assert "cancelled" in shown.text and shown.find_elements(By.CLASS_NAME, "cancel-batch") == []
        browser.get(served.base + f"/admin/scheduling/batchrequest/?batch={batch.id}&state__exact=failed")
        assert "batch_cancelled" in browser.find_element(By.ID, "result_list").text
