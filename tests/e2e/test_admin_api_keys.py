"""The admin's API keys in a real headless Chromium: make a key, see its secret once, use it, edit its scope,
revoke it."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.admin.session import create_superuser
from tests.e2e.test_admin_browser import browser, log_in  # noqa: F401 - the fixture
from tests.served import Served, fake_cmd, wait_until

pytestmark = pytest.mark.e2e

KEYS = "/admin/scheduling/apikey/"


def test_a_key_made_in_the_admin_shows_its_secret_once_works_and_is_revoked(tmp_path, browser):  # noqa: F811
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    config = f"""
        models:
          qwen3:
            cmd: {fake_cmd("qwen3")}
          llama:
            cmd: {fake_cmd("llama")}
    """
    with Served(tmp_path, config) as served:
        create_superuser(served, "alice", "correct-horse-battery")
        log_in(browser, served)
        wait_until(lambda: "llamaswap administration" in browser.page_source, what="the admin index")

        browser.get(served.base + KEYS + "add/")
        browser.find_element(By.NAME, "name").send_keys("dashboard")
        browser.find_element(By.NAME, "allowed_models").send_keys("qwen*")
        browser.find_element(By.NAME, "max_priority").send_keys("0")
        browser.find_element(By.NAME, "rpm").send_keys("120")
        browser.find_element(By.NAME, "_save").click()
        shown = wait_until(lambda: browser.find_elements(By.ID, "api-key-secret"), what="the secret on the page")
        secret = shown[0].text
        assert secret.startswith("lsk-") and "only now" in browser.page_source

        models = wait_until(lambda: (r := httpx.get(served.base + "/v1/models", headers={"x-api-key": secret}))
                            .status_code == 200 and r, 2.0, 0.05, "the new key accepted")
        assert [entry["id"] for entry in models.json()["data"]] == ["qwen3"]

        browser.get(served.base + KEYS)
        listing = browser.page_source
        assert "dashboard" in listing and secret[:12] in listing and secret not in listing and "120" in listing
        browser.find_element(By.LINK_TEXT, "dashboard").click()
        wait_until(lambda: "Change API key" in browser.page_source, what="the key's page")
        assert secret not in browser.page_source
        models_box = browser.find_element(By.NAME, "allowed_models")
        models_box.clear()
        models_box.send_keys("llama")
        browser.find_element(By.NAME, "_save").click()
        wait_until(lambda: "was changed successfully" in browser.page_source, what="the edit saved")
        deadline = time.monotonic() + 2.0
        wait_until(lambda: [entry["id"] for entry in httpx.get(served.base + "/v1/models", headers={"x-api-key": secret})
                            .json()["data"]] == ["llama"], deadline - time.monotonic(), 0.05, "the new scope applied")

        browser.get(served.base + KEYS)
        browser.find_element(By.CSS_SELECTOR, "input.action-select").click()
        Select(browser.find_element(By.NAME, "action")).select_by_value("revoke")
        browser.find_element(By.NAME, "index").click()
        wait_until(lambda: "Revoked 1 key" in browser.page_source, what="the revoke message")
        revoked_at = time.monotonic()
        wait_until(lambda: httpx.get(served.base + "/v1/models", headers={"x-api-key": secret}).status_code == 401,
                   2.0, 0.02, "the revoked key refused")
        assert time.monotonic() - revoked_at < 2.0
        assert "revoked" in browser.page_source
        assert secret not in served.log()
