"""Operate a served instance's admin over HTTP, the way a person with a browser would."""

from __future__ import annotations

import re
import subprocess
import sys

import httpx

from tests.served import REPO, Served


def create_superuser(served: Served, username: str, password: str) -> None:
    """`manage.py createsuperuser --noinput` against the served instance's database."""
    env = {**served.env, "DJANGO_SUPERUSER_PASSWORD": password}
    subprocess.run(
        [sys.executable, str(REPO / "manage.py"), "createsuperuser", "--noinput", "--username", username,
         "--email", f"{username}@example.com"],
        cwd=REPO, env=env, check=True, capture_output=True, timeout=60,
    )


class AdminSession:
    """A logged-in admin user: GETs pages and POSTs forms with the CSRF token."""

    def __init__(self, served: Served, username: str, password: str):
        self.http = httpx.Client(base_url=served.base, timeout=30)
        login = self.http.get("/admin/login/")
        response = self.http.post(
            "/admin/login/",
            data={"username": username, "password": password, "csrfmiddlewaretoken": self._token(login.text),
                  "next": "/admin/"},
        )
        if response.status_code != 302:
            raise AssertionError(f"admin login as {username} failed: {response.status_code}")

    @staticmethod
    def _token(page: str) -> str:
        match = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
        if match is None:
            raise AssertionError("no CSRF token on the page")
        return match.group(1)

    def get(self, url: str, **params) -> str:
        response = self.http.get(url, params=params)
        assert response.status_code == 200, f"GET {url}: {response.status_code}"
        return response.text

    def post(self, url: str, data: dict) -> httpx.Response:
        """POST a form on `url` (read first for its CSRF token); returns the response unfollowed."""
        token = self._token(self.get(url))
        return self.http.post(url, data={**data, "csrfmiddlewaretoken": token})

    def close(self) -> None:
        self.http.close()


def queue_rows(page: str) -> list[dict[str, str]]:
    """The queue page's rows, best first: ticket id plus each score column's text."""
    rows = []
    for ticket, body in re.findall(r'<tr id="ticket-(\d+)" class="queue-entry">(.*?)</tr>', page, re.S):
        cells = dict(re.findall(r'<td class="(\w+)">(?:<strong>)?([^<]*)', body))
        rows.append({"ticket": int(ticket), **cells})
    return rows


def cell(page: str, row_id: str, css_class: str) -> str:
    """The text of one cell of the row with that id."""
    row = re.search(rf'<tr id="{re.escape(row_id)}"[^>]*>(.*?)</tr>', page, re.S)
    assert row, f"no row {row_id} on the page"
    match = re.search(rf'class="{css_class}">([^<]*)', row.group(1))
    assert match, f"no {css_class} cell in row {row_id}"
    return match.group(1).strip()




def running_rows(page: str) -> list[dict[str, str | int]]:
    """The queue page's "Running now" rows: ticket id, model, and the text of each cell, busy slots included."""
    rows = []
    pattern = r'<tr id="running-(\d+)" class="running-entry" data-model="([^"]*)">(.*?)</tr>'
    for ticket, model, body in re.findall(pattern, page, re.S):
        cells = dict(re.findall(r'<t[dh][^>]* class="([\w-]+)">([^<]*)', body))
        rows.append({"ticket": int(ticket), "model": model, **{k: v.strip() for k, v in cells.items()}})
    return rows
