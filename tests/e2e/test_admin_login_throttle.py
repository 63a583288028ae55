"""The admin's login throttling (django-axes) in a real headless Chromium: wrong passwords lock the user name out
from that address, the right password is then refused too, and after the cool-off it works again."""

from __future__ import annotations

import re
import subprocess
import sys
import time

import httpx
import pytest

from tests.admin.session import create_superuser
from tests.e2e.test_admin_browser import browser  # noqa: F401 - the fixture
from tests.served import REPO, Served, fake_cmd, wait_until

pytestmark = pytest.mark.e2e

LIMIT, COOL_OFF_S = 3, 4.0
RIGHT = "correct-horse-battery"


def try_login(browser, served, password: str) -> str:
    """Submit the login form as alice; the page it leads to."""
    from selenium.webdriver.common.by import By

    browser.get(served.base + "/admin/login/?next=/admin/")
    browser.find_element(By.NAME, "username").send_keys("alice")
    browser.find_element(By.NAME, "password").send_keys(password)
    browser.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    wait_until(lambda: "/admin/login/" not in browser.current_url or "errornote" in browser.page_source,
               what="the login's answer")
    return browser.page_source


def status_of_login(served, username: str, password: str) -> int:
    """The HTTP status of one login, sent as a form with its CSRF token."""
    with httpx.Client(base_url=served.base) as http:
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', http.get("/admin/login/").text).group(1)
        return http.post("/admin/login/", data={"username": username, "password": password, "next": "/admin/",
                                                 "csrfmiddlewaretoken": token}).status_code


@pytest.fixture
def served(tmp_path):
    config = f"""
        models:
          qwen3:
            cmd: {fake_cmd("qwen3")}
    """
    env = {"LLAMASWAP_LOGIN_FAILURE_LIMIT": str(LIMIT), "LLAMASWAP_LOGIN_COOLOFF_SECONDS": str(COOL_OFF_S)}
    with Served(tmp_path, config, env=env) as served:
        create_superuser(served, "alice", RIGHT)
        yield served


def test_wrong_passwords_lock_the_login_out_until_the_cool_off_ends(served, browser):  # noqa: F811
    for attempt in range(1, LIMIT):
        page = try_login(browser, served, f"wrong-{attempt}")
        assert "Please enter the correct username and password" in page
    page = try_login(browser, served, f"wrong-{LIMIT}")
    last_try = time.monotonic()
    assert 'id="login-locked"' in page and "Too many failed logins for alice" in page
    assert "axes_reset_username alice" in page and "llamaswap" in page  # the admin's header, not Django's

    page = try_login(browser, served, RIGHT)  # the right password is refused while locked (and restarts the wait)
    assert 'id="login-locked"' in page and "llamaswap administration" not in page
    assert status_of_login(served, "alice", RIGHT) == 429
    last_try = time.monotonic()

    wait_until(lambda: time.monotonic() > last_try + COOL_OFF_S, COOL_OFF_S + 1, 0.1, "the cool-off to end")
    page = try_login(browser, served, RIGHT)
    assert "llamaswap administration" in page and 'id="login-locked"' not in page


def test_an_operator_lifts_the_lock_with_axes_reset(served, browser):  # noqa: F811
    for attempt in range(LIMIT):
        page = try_login(browser, served, f"wrong-{attempt}")
    assert 'id="login-locked"' in page
    subprocess.run([sys.executable, str(REPO / "manage.py"), "axes_reset_username", "alice"],
                   cwd=REPO, env=served.env, check=True, capture_output=True, timeout=60)
    page = try_login(browser, served, RIGHT)
    assert "llamaswap administration" in page
