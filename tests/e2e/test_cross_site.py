"""A page on another origin cannot change anything by riding on the Basic credentials a browser saved.

Every 401 asks for Basic credentials, so a browser given the key once sends it again on its own, also
with the forms and images of any other page it opens. The browser test runs real headless Chromium:
it authenticates once, then opens a page served from another loopback port that submits a form and
loads images aimed at the state-changing routes; nothing may change. The same browser, on this
server's own origin, still works.
"""

from __future__ import annotations

import base64
import http.server
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tests.e2e.test_admin_browser import browser_or_skip
from tests.served import Served, fake_cmd, free_port, read_events, wait_until

pytestmark = pytest.mark.e2e

KEY = "sk-browser-4c1d"
BASIC = {"Authorization": "Basic " + base64.b64encode(f"anyone:{KEY}".encode()).decode()}
BEARER = {"Authorization": f"Bearer {KEY}"}


@contextmanager
def serving(tmp: Path) -> Iterator[Served]:
    """The service with `loaded` up (after one request) and `idle` never started."""
    text = f"""
        apiKeys: ["{KEY}"]
        models:
          loaded: {{cmd: "{fake_cmd('loaded', tmp / 'loaded.jsonl', '--tps', '0')}"}}
          idle: {{cmd: "{fake_cmd('idle', tmp / 'idle.jsonl', '--tps', '0')}"}}
        profiles:
          quiet: {{pins: {{idle: loaded}}}}
    """
    with Served(tmp, text) as s:
        s.events = {"loaded": tmp / "loaded.jsonl", "idle": tmp / "idle.jsonl"}
        chat = {"model": "loaded", "messages": [], "fake": {"tokens": 1}}
        assert httpx.post(s.base + "/v1/chat/completions", json=chat, headers=BEARER, timeout=30).status_code == 200
        yield s


@pytest.fixture
def served(tmp_path):
    with serving(tmp_path) as s:
        yield s


@pytest.fixture(scope="module")
def unchanged(tmp_path_factory):
    """One instance shared by the tests that must change nothing: each checks that it did not, so one
    that did fails itself rather than a later one."""
    with serving(tmp_path_factory.mktemp("cross-site")) as s:
        yield s


def running(served) -> list[str]:
    return [item["model"] for item in httpx.get(served.base + "/running", headers=BEARER, timeout=10).json()["running"]]


def starts(served, model: str) -> int:
    path = served.events[model]
    return len([e for e in read_events(path) if e["event"] == "start"]) if path.exists() else 0


OTHER_PAGE = "http://127.0.0.1:8081"
CHANGES = [
    ("GET", "/unload", None),
    ("POST", "/api/models/unload", None),
    ("POST", "/api/models/unload/loaded", None),
    ("DELETE", "/api/queue/1", None),
    ("PATCH", "/api/queue/1", b'{"priority": 100}'),
    ("POST", "/api/inflight/1/cancel", None),
    ("PUT", "/api/profiles/active", b'{"name": "quiet"}'),
    ("POST", "/v1/chat/completions", b'{"model": "idle", "messages": []}'),
    ("GET", "/upstream/idle/health", None),
    ("POST", "/v1/files", b'--x\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n--x--\r\n'),
    ("DELETE", "/v1/files/file-0", None),
    ("POST", "/v1/batches", b'{"input_file_id": "file-0", "endpoint": "/v1/chat/completions", "completion_window": "24h"}'),
    ("POST", "/v1/batches/batch_0/cancel", None),
]


@pytest.mark.parametrize("site_headers", [
    {"Sec-Fetch-Site": "cross-site", "Origin": "https://evil.example"},
    {"Sec-Fetch-Site": "same-site"},  # another port of this host: the same site, another origin
    {"Origin": OTHER_PAGE},  # a browser without Fetch Metadata
    {"Origin": "null"},
])
def test_a_change_from_another_origin_with_basic_credentials_is_403_and_changes_nothing(unchanged, site_headers):
    for method, path, body in CHANGES:
        r = httpx.request(method, unchanged.base + path, content=body, headers={**BASIC, **site_headers}, timeout=30)
        assert r.status_code == 403, (method, path, r.status_code, r.text)
        error = r.json()["error"]
        assert (error["code"], error["type"]) == ("cross_site_request", "permission_error")
        assert "Basic" in error["message"] and "Bearer" in error["message"]
    assert running(unchanged) == ["loaded"] and starts(unchanged, "idle") == 0
    assert httpx.get(unchanged.base + "/api/profiles", headers=BEARER, timeout=10).json()["active"] is None
    assert httpx.get(unchanged.base + "/v1/batches", headers=BEARER, timeout=10).json()["data"] == []


@pytest.mark.parametrize("caller", [
    {**BEARER, "Sec-Fetch-Site": "cross-site", "Origin": "https://chat.example"},  # the page holds the key itself
    {"x-api-key": KEY, **BASIC, "Sec-Fetch-Site": "cross-site", "Origin": "https://chat.example"},
    {**BASIC, "Sec-Fetch-Site": "same-origin"},
    {**BASIC, "Sec-Fetch-Site": "none"},  # typed into the address bar
    {**BASIC},  # not a browser
])
def test_the_key_shown_explicitly_or_basic_from_this_origin_may_change_things(served, caller):
    r = httpx.post(served.base + "/api/models/unload", headers=caller, timeout=30)
    assert r.status_code == 200, r.text
    wait_until(lambda: running(served) == [], 15, what="the model to unload")


def test_a_wrong_key_beside_the_saved_basic_credentials_does_not_unlock_them(unchanged):
    caller = {**BASIC, "x-api-key": "not-the-key", "Sec-Fetch-Site": "cross-site", "Origin": "https://evil.example"}
    assert httpx.post(unchanged.base + "/api/models/unload", headers=caller, timeout=30).status_code == 403
    assert running(unchanged) == ["loaded"]


def test_reads_from_another_origin_are_still_answered(unchanged):
    for path in ("/running", "/v1/models", "/api/queue", "/v1/files", "/v1/batches"):
        r = httpx.get(unchanged.base + path, headers={**BASIC, "Sec-Fetch-Site": "cross-site"}, timeout=10)
        assert r.status_code == 200, (path, r.text)


def test_a_websocket_from_another_origin_on_basic_credentials_is_closed_with_4403(served):
    websocket = pytest.importorskip("websocket")  # websocket-client
    url = served.base.replace("http://", "ws://") + "/upstream/idle/ws"
    ws = websocket.create_connection(url, header=[f"Authorization: {BASIC['Authorization']}"],
                                     origin=OTHER_PAGE, timeout=15)
    try:
        opcode, data = ws.recv_data(control_frame=True)
        assert (opcode, int.from_bytes(data[:2], "big")) == (websocket.ABNF.OPCODE_CLOSE, 4403)
    finally:
        ws.close()
    assert starts(served, "idle") == 0  # a socket from another page reads back what it asks: it never got one
    ws = websocket.create_connection(url, header=[f"Authorization: {BASIC['Authorization']}"],
                                     origin=served.base, timeout=15)
    try:  # this server's own origin
        ws.send("hello")
        assert ws.recv() == "hello"
    finally:
        ws.close()


class OtherOrigin:
    """A web page on another loopback port: what any site the operator visits could serve."""

    def __init__(self, html: str):
        page = html.encode()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(page)))
                self.end_headers()
                self.wfile.write(page)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def attack_page(base: str) -> str:
    """Forms and images aimed at the state changes a page can send without script access to the key;
    each reports in the title when its answer came."""
    return f"""<!doctype html><title>0</title>
<script>function done() {{ document.title = String(Number(document.title) + 1); }}</script>
<iframe name="sink1" onload="if (this.dataset.sent) done()"></iframe>
<iframe name="sink2" onload="if (this.dataset.sent) done()"></iframe>
<iframe name="sink3" onload="if (this.dataset.sent) done()"></iframe>
<form id="unload" method="POST" action="{base}/api/models/unload" target="sink1"></form>
<form id="cancel" method="POST" action="{base}/api/inflight/1/cancel" target="sink2"></form>
<form id="chat" method="POST" action="{base}/v1/chat/completions" target="sink3" enctype="text/plain">
  <input name='{{"model": "idle", "messages": [], "x": "' value='"}}'>
</form>
<img src="{base}/unload" onload="done()" onerror="done()">
<img src="{base}/upstream/idle/health" onload="done()" onerror="done()">
<script>
  for (const [form, sink] of [["unload", "sink1"], ["cancel", "sink2"], ["chat", "sink3"]]) {{
    document.getElementsByName(sink)[0].dataset.sent = "1";
    document.getElementById(form).submit();
  }}
</script>"""


def test_in_chromium_a_page_on_another_origin_changes_nothing_and_this_origin_still_works(served, tmp_path):
    browser = browser_or_skip(tmp_path / "chromium-profile")
    other = OtherOrigin(attack_page(served.base))
    try:
        # The operator authenticates once, as the 401's Basic challenge lets a browser; it keeps the key.
        browser.get(served.base.replace("http://", f"http://operator:{KEY}@") + "/running")
        assert '"loaded"' in browser.page_source
        browser.get(served.base + "/running")  # no credentials in the URL: the saved ones are sent
        assert '"loaded"' in browser.page_source

        browser.get(other.url)
        wait_until(lambda: browser.title == "5", 30, 0.1, "every form and image of the other page to be answered")
        assert running(served) == ["loaded"], "a page on another origin unloaded the model"
        assert starts(served, "idle") == 0, "a page on another origin started a model"

        # This server's own origin, with the same saved credentials: a script on its page may unload.
        browser.get(served.base + "/running")
        status = browser.execute_async_script(
            "const done = arguments[0];"
            "fetch('/api/models/unload', {method: 'POST'}).then(r => done(r.status), e => done(String(e)));"
        )
        assert status == 200
        wait_until(lambda: running(served) == [], 15, what="the same-origin unload")
    finally:
        other.close()
        browser.quit()
