"""An operator in a real headless Chromium: log in, watch what runs and what waits, retune swapAffinityBonus,
see the dispatch follow."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.admin.session import create_superuser
from tests.admin.traffic import Caller, GpuHolder, started_ids, two_model_config
from tests.e2e.conftest import db_rows
from tests.served import REPO, Served, wait_until

pytestmark = pytest.mark.e2e

SCREENSHOT = REPO / "test-artifacts" / "queue-page.png"
OVERVIEW_SCREENSHOT = REPO / "test-artifacts" / "overview-page.png"
PREVIEW_SCREENSHOT = REPO / "test-artifacts" / "settings-preview.png"
CHROMIUM_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync", "--window-size=1400,900",
)


def browser_or_skip(profile: Path):
    """A headless Chromium driven by selenium; skips with the reason when one is missing."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    missing = []
    if chromium is None or driver is None:
        missing.append("Chromium and its driver (apt-get install -y chromium chromium-driver)")
    try:
        from selenium import webdriver
    except ImportError:
        missing.append("selenium (pip install -e '.[dev]')")
    if missing:
        pytest.skip(f"the browser test needs {' and '.join(missing)}")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(executable_path=driver), options=options)


def log_in(browser, served) -> None:
    """Logs in and waits for the admin index: a page asked for before the login's answer arrives would
    cancel it and land on the login form again."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(served.base + "/admin/login/?next=/admin/")
    browser.find_element(By.NAME, "username").send_keys("alice")
    browser.find_element(By.NAME, "password").send_keys("correct-horse-battery")
    browser.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    WebDriverWait(browser, 15).until(lambda d: "llamaswap administration" in d.page_source
                                     and "/admin/login/" not in d.current_url, message="waiting for the admin index")


@pytest.fixture
def browser(tmp_path):
    driver = browser_or_skip(tmp_path / "chromium-profile")
    yield driver
    driver.quit()


@contextmanager
def serving(tmp: Path) -> Iterator[Served]:
    events, text = two_model_config(tmp, bonus=10)
    with Served(tmp, text) as s:
        s.events = events
        create_superuser(s, "alice", "correct-horse-battery")
        yield s


@pytest.fixture
def served(tmp_path):
    with serving(tmp_path) as s:
        yield s


@pytest.fixture(scope="module")
def served_three(tmp_path_factory):
    """One instance that has served three requests (alpha, beta, alpha), shared by the tests that
    only read what they left: the overview and a preview that saves nothing."""
    with serving(tmp_path_factory.mktemp("three-served")) as s:
        for model in ("alpha", "beta", "alpha"):  # three dispatches, at least two of them model loads
            assert Caller(s, model, 0, model).wait()[0] == 200
        wait_until(lambda: len(db_rows(s.data_dir, "state = 'completed'")) == 3, 30, what="three finished rows")
        yield s


def test_an_operator_retunes_swap_affinity_and_the_next_dispatch_follows(browser, served):
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    def wait(condition, what, timeout=15):
        return WebDriverWait(browser, timeout, ignored_exceptions=[StaleElementReferenceException]).until(
            lambda d: condition(), message=f"waiting for {what}")

    def ranked_models():
        return [row.find_element(By.CLASS_NAME, "model").text
                for row in browser.find_elements(By.CSS_SELECTOR, "tr.queue-entry")]

    log_in(browser, served)

    holder = GpuHolder(served)
    beta = Caller(served, "beta", 0, "beta")
    browser.find_element(By.LINK_TEXT, "Queue").click()
    wait(lambda: ranked_models() == ["beta"], "beta on the queue page")
    alpha = Caller(served, "alpha", 0, "alpha")
    # alpha is loaded: with swapAffinityBonus 10 the newer alpha request is ranked ahead of beta.
    wait(lambda: ranked_models() == ["alpha", "beta"], "alpha ranked first by its affinity bonus")
    running = browser.find_elements(By.CSS_SELECTOR, "#running-now tr.running-entry")
    assert [(row.get_attribute("data-model"), row.find_element(By.CLASS_NAME, "slots-busy").text) for row in running] \
        == [("alpha", "1/1")]
    assert browser.find_element(By.ID, "running-now").location["y"] < browser.find_element(By.ID, "result_list").location["y"]
    SCREENSHOT.parent.mkdir(exist_ok=True)
    browser.save_screenshot(str(SCREENSHOT))

    browser.get(served.base + "/admin/scheduling/schedulersettings/")
    bonus = browser.find_element(By.NAME, "swap_affinity_bonus")
    bonus.clear()
    bonus.send_keys("0")
    browser.find_element(By.NAME, "_save").click()
    wait(lambda: "was changed successfully" in browser.page_source, "the settings to save")
    assert browser.find_element(By.CSS_SELECTOR, "#setting-swapAffinityBonus .in-use").text == "0"

    browser.get(served.base + "/admin/scheduling/waitingrequest/")
    wait(lambda: ranked_models() == ["beta", "alpha"], "the queue ranked by arrival once the bonus is 0", timeout=2)

    holder.release()
    assert beta.wait()[0] == 200 and alpha.wait()[0] == 200
    assert started_ids(served) == ["holder", "beta", "alpha"]


def test_the_overview_draws_its_charts_from_the_traffic_served(browser, served_three):
    from selenium.webdriver.common.by import By

    log_in(browser, served_three)
    browser.find_element(By.LINK_TEXT, "Overview").click()
    browser.find_element(By.LINK_TEXT, "1h").click()
    assert browser.find_element(By.CSS_SELECTOR, ".overview-windows strong").text == "1h"
    charts = browser.find_elements(By.CSS_SELECTOR, "svg.chart")
    assert len(charts) == 5
    assert all(chart.is_displayed() and chart.size["height"] > 100 for chart in charts)
    assert browser.find_element(By.CSS_SELECTOR, "#total-normal .dispatched").text == "3"
    loads = browser.find_elements(By.CSS_SELECTOR, "#chart-4 svg rect title")
    assert sum(int(title.get_attribute("textContent").rsplit(": ", 1)[1]) for title in loads) >= 2
    browser.set_window_size(1400, browser.execute_script("return document.body.scrollHeight") + 200)  # every chart
    OVERVIEW_SCREENSHOT.parent.mkdir(exist_ok=True)
    browser.save_screenshot(str(OVERVIEW_SCREENSHOT))


def test_a_preview_replays_the_traffic_served_with_the_values_typed_and_saves_nothing(browser, served_three):
    from selenium.webdriver.common.by import By

    log_in(browser, served_three)
    browser.get(served_three.base + "/admin/scheduling/schedulersettings/")
    bonus = browser.find_element(By.NAME, "swap_affinity_bonus")
    bonus.clear()
    bonus.send_keys("0")
    browser.find_element(By.NAME, "_preview").click()
    panel = browser.find_element(By.ID, "settings-preview")
    assert panel.is_displayed() and "Replay of 3 requests" in panel.text
    chart = browser.find_element(By.CSS_SELECTOR, "#preview-chart svg.chart")
    assert chart.is_displayed() and chart.size["height"] > 100
    assert "swapAffinityBonus=0" in browser.find_element(By.ID, "preview-table").text
    assert browser.find_element(By.NAME, "swap_affinity_bonus").get_attribute("value") == "0"
    assert browser.find_element(By.CSS_SELECTOR, "#setting-swapAffinityBonus .override").text == "—"  # not saved
    browser.set_window_size(1400, browser.execute_script("return document.body.scrollHeight") + 200)
    PREVIEW_SCREENSHOT.parent.mkdir(exist_ok=True)
    browser.save_screenshot(str(PREVIEW_SCREENSHOT))
