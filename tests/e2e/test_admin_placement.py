"""The admin Models page with `hardware:` described: each GPU's memory and the models placed on it, in a real
headless Chromium after a request loaded a model; per box in distributed mode; and a page that still renders,
saying why placement is unknown, while the worker does not answer; and the lease list with each lease's state."""

from __future__ import annotations

import html
import re
import signal

import httpx
import pytest

from tests.admin.session import AdminSession, cell, create_superuser
from tests.e2e.test_admin_browser import browser, log_in  # noqa: F401 - the fixture
from tests.e2e.test_distributed import distributed  # noqa: F401 - the fixture
from tests.served import REPO, Served, Worker, fake_cmd, wait_until

pytestmark = pytest.mark.e2e

MODELS = "/admin/scheduling/configuredmodel/"
LEASES = "/admin/scheduling/modellease/"
SCREENSHOT = REPO / "test-artifacts" / "models-placement.png"
ODD = "<b>odd</b>"  # a model ID is the operator's text: the page must show it, not run it


def config(events) -> str:
    return f"""
        healthCheckTimeout: 20
        hardware:
          gpus:
            - {{id: 0, memory: 24GiB}}
            - {{id: 1, memory: 24GiB}}
          cpu: {{memory: 64GiB}}
        models:
          chat:
            cmd: {fake_cmd("chat", events)}
            memory: 20GiB
          "{ODD}":
            cmd: {fake_cmd("odd", events)}
            memory: 12GiB
            pinned: true
    """


def ask(served, model: str) -> int:
    return httpx.post(served.base + "/v1/chat/completions", timeout=30,
                      json={"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}).status_code


def test_the_models_page_shows_each_gpu_and_the_gpu_a_request_loaded_its_model_on(tmp_path, browser):  # noqa: F811
    from selenium.webdriver.common.by import By

    with Served(tmp_path, config(tmp_path / "events.jsonl")) as served:
        create_superuser(served, "alice", "correct-horse-battery")
        log_in(browser, served)
        wait_until(lambda: "llamaswap administration" in browser.page_source, what="the admin index")

        def memory_rows():
            return [[cell.text for cell in row.find_elements(By.TAG_NAME, "td")]
                    for row in browser.find_elements(By.CSS_SELECTOR, "#box-1 tr.memory-row")]

        browser.get(served.base + MODELS)
        assert [row[:3] + row[4:] for row in memory_rows()] == [
            ["GPU 0", "24.0 GiB", "0 MiB", "—"], ["GPU 1", "24.0 GiB", "0 MiB", "—"], ["CPU", "64.0 GiB", "0 MiB", "—"]]
        assert browser.find_elements(By.CSS_SELECTOR, "#box-1 tr.placed-model") == []

        assert ask(served, "chat") == 200
        assert ask(served, ODD) == 200
        lease = httpx.post(served.base + "/api/leases", json={"model": "chat", "seconds": 600}, timeout=10).json()

        def leased_shown():
            browser.get(served.base + MODELS)
            return f"lease #{lease['id']}" in browser.find_element(By.ID, "placement").text

        wait_until(leased_shown, 10, 0.2, "the lease to reach the scheduler")
        assert [row[:3] + row[4:] for row in memory_rows()] == [
            ["GPU 0", "24.0 GiB", "20.0 GiB", "chat"], ["GPU 1", "24.0 GiB", "12.0 GiB", ODD],
            ["CPU", "64.0 GiB", "0 MiB", "—"]]
        placed = {row.find_element(By.CLASS_NAME, "model").text: row
                  for row in browser.find_elements(By.CSS_SELECTOR, "#box-1 tr.placed-model")}
        assert set(placed) == {"chat", ODD}  # shown as text: no <b> element made of it
        assert browser.find_elements(By.CSS_SELECTOR, "#placement b") == []
        chat, odd = placed["chat"], placed[ODD]
        assert [chat.find_element(By.CLASS_NAME, c).text for c in ("gpus", "declared", "protected")] == \
            ["0", "20.0 GiB", f"lease #{lease['id']}"]
        assert [odd.find_element(By.CLASS_NAME, c).text for c in ("gpus", "declared", "protected", "lease")] == \
            ["1", "12.0 GiB", "pinned", "—"]
        shown = httpx.get(served.base + "/api/placement", timeout=10).json()
        shown_cost = shown["boxes"][0]["models"]["chat"]["eviction_cost"]  # the page shows the API's figure
        assert float(chat.find_element(By.CLASS_NAME, "eviction-cost").text) == pytest.approx(shown_cost, abs=0.05)
        SCREENSHOT.parent.mkdir(exist_ok=True)
        browser.save_screenshot(str(SCREENSHOT))
        history = {link.text: link.get_attribute("href") for link in browser.find_elements(By.CSS_SELECTOR, "td.model-id a")}
        assert history[ODD].endswith("?model=%3Cb%3Eodd%3C%2Fb%3E"), "a model's history link carries its ID encoded"
        chat.find_element(By.CSS_SELECTOR, ".lease a").click()  # to the lease in the admin's lease list
        wait_until(lambda: "/admin/scheduling/modellease/" in browser.current_url, what="the lease list")
        assert [row.find_element(By.CSS_SELECTOR, ".field-id").text
                for row in browser.find_elements(By.CSS_SELECTOR, "#result_list tbody tr")] == [str(lease["id"])]


def test_a_front_end_shows_its_worker_box_and_still_renders_the_page_while_the_worker_does_not_answer(
        tmp_path, distributed):  # noqa: F811
    env, _ = distributed
    text = config(tmp_path / "events.jsonl")
    with Worker(tmp_path / "worker", text, env) as worker:
        (tmp_path / "fe").mkdir()
        with Served(tmp_path / "fe", text, env={**env, "LLAMASWAP_DATA_DIR": str(tmp_path / "fe" / "data")}) as front:
            create_superuser(front, "alice", "correct-horse-battery")
            admin = AdminSession(front, "alice", "correct-horse-battery")
            assert ask(front, "chat") == 200
            page = admin.get(MODELS)
            assert cell(page, "box-1-memory-1", "models") == "chat" and cell(page, "box-1-model-1", "gpus") == "0"
            assert 'class="box-name"' in page  # the worker's host names its box

            worker.proc.send_signal(signal.SIGSTOP)
            try:
                page = admin.get(MODELS)  # the worker is asked and times out, or is already left out as silent
            finally:
                worker.proc.send_signal(signal.SIGCONT)
            assert 'id="placement-missing"' in page and 'id="box-1"' not in page
            assert cell(page, "model-1", "state") == cell(page, "model-2", "state") == "no answer"
            assert ">&lt;b&gt;odd&lt;/b&gt;</a>" in page and ODD not in page  # the models still listed, escaped
            admin.close()


def lease_states(page: str) -> dict[int, str]:
    """The admin lease list's rows: each lease's id and the text of its state column."""
    rows = re.findall(r'<tr>(.*?)</tr>', page, re.S)
    found = {}
    for row in rows:
        lease_id = re.search(r'class="field-id"><a [^>]*>(\d+)</a>', row)
        state = re.search(r'class="field-state">([^<]*)<', row)
        if lease_id and state:
            found[int(lease_id.group(1))] = html.unescape(state.group(1))
    return found


def test_the_lease_list_says_what_each_lease_is_doing(tmp_path):
    events = tmp_path / "events.jsonl"
    text = f"""
        healthCheckTimeout: 20
        hardware:
          gpus: [{{id: 0, memory: 24GiB}}]
        models:
          first:
            cmd: {fake_cmd("first", events)}
            memory: 20GiB
          second:
            cmd: {fake_cmd("second", events)}
            memory: 20GiB
    """
    with Served(tmp_path, text) as served:
        create_superuser(served, "alice", "correct-horse-battery")
        admin = AdminSession(served, "alice", "correct-horse-battery")
        first = httpx.post(served.base + "/api/leases", json={"model": "first", "seconds": 600}, timeout=10).json()
        wait_until(lambda: lease_states(admin.get(LEASES)) == {first["id"]: "loaded"}, 20, 0.2,
                   "the first lease's model to load")
        second = httpx.post(served.base + "/api/leases", json={"model": "second", "seconds": 600}, timeout=10).json()
        assert lease_states(admin.get(LEASES)) == {
            first["id"]: "loaded", second["id"]: f"waiting: blocked by first (lease #{first['id']})"}
        assert httpx.delete(served.base + f"/api/leases/{first['id']}", timeout=10).status_code == 200
        wait_until(lambda: lease_states(admin.get(LEASES)).get(second["id"]) == "loaded", 20, 0.2,
                   "the second lease's model to load once the first lease is revoked")
        assert set(lease_states(admin.get(LEASES))) == {second["id"]}  # a revoked lease's row is gone
        admin.close()
