"""Security settings and the API-key check: what an operator relies on without reading the code."""

from __future__ import annotations

import base64
import hmac
import json
import os
import re
import stat
import subprocess
import sys

import httpx
import pytest
from django.test import Client

from django.utils import timezone

from proxy.serving import access
from scheduling.keys.store import KeyRows
from tests.served import REPO, Served, fake_cmd

KEYS = ["sk-first-0001", "sk-second-0002", "sk-third-0003"]
NO_ROWS = KeyRows({}, 0)


def admitted(headers: dict[str, str], keys: list[str]) -> bool:
    return isinstance(access.identify(headers, keys, NO_ROWS, timezone.now()), access.Caller)


@pytest.fixture
def comparisons(monkeypatch):
    """Counts every hmac.compare_digest the key check makes."""
    calls = []
    compare = hmac.compare_digest

    def counting(a, b):
        calls.append((a, b))
        return compare(a, b)

    monkeypatch.setattr(access.hmac, "compare_digest", counting)
    return calls


@pytest.mark.parametrize("presented", [KEYS[0], KEYS[2], "sk-first-000", "sk-first-00011", "", "x" * 500, "é"])
def test_every_configured_key_is_compared_in_constant_time_whatever_matches(comparisons, presented):
    """No early exit: which key matched (or how much of one) must not change how long the check takes."""
    accepted = admitted({"authorization": f"Bearer {presented}"}, KEYS)
    assert accepted == (presented in KEYS)
    if presented:
        assert len(comparisons) == len(KEYS)
        assert sorted(b for _, b in comparisons) == sorted(k.encode() for k in KEYS)


def test_keys_presented_in_several_places_are_each_compared_with_every_key(comparisons):
    basic = base64.b64encode(f"user:{KEYS[1]}".encode()).decode()
    assert admitted({"x-api-key": "wrong", "authorization": f"Basic {basic}"}, KEYS)
    assert len(comparisons) == 2 * len(KEYS)


def test_no_keys_configured_means_open_and_nothing_compared(comparisons):
    assert admitted({}, [])
    assert comparisons == []


@pytest.fixture
def operators(django_user_model):
    staff = django_user_model.objects.create_user("operator", password="pw-operator-1", is_staff=True,
                                                  is_superuser=True)
    plain = django_user_model.objects.create_user("member", password="pw-member-1")
    return staff, plain


@pytest.mark.django_db
@pytest.mark.parametrize("url", ["/admin/", "/admin/auth/user/", "/admin/scheduling/queuedrequest/"])
def test_the_admin_sends_non_staff_users_to_the_login_page(operators, url):
    _, plain = operators
    client = Client()
    client.force_login(plain)
    response = client.get(url)
    assert response.status_code == 302
    assert response["Location"].startswith("/admin/login/")


@pytest.mark.django_db
def test_a_non_staff_user_cannot_log_in_to_the_admin(operators):
    client = Client()
    response = client.post("/admin/login/", {"username": "member", "password": "pw-member-1", "next": "/admin/"})
    assert response.status_code == 200  # the form again, with an error
    assert "staff account" in response.content.decode()
    assert "_auth_user_id" not in client.session


@pytest.mark.django_db
def test_the_admin_login_needs_the_csrf_token(operators):
    client = Client(enforce_csrf_checks=True)
    refused = client.post("/admin/login/", {"username": "operator", "password": "pw-operator-1"})
    assert refused.status_code == 403
    form = client.get("/admin/login/")
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form.content.decode()).group(1)
    accepted = client.post("/admin/login/", {"username": "operator", "password": "pw-operator-1",
                                             "csrfmiddlewaretoken": token, "next": "/admin/auth/user/"})
    assert accepted.status_code == 302 and accepted["Location"] == "/admin/auth/user/"
    cookie = accepted.cookies["sessionid"]
    assert cookie["httponly"] is True
    assert not cookie["secure"]  # plain HTTP unless LLAMASWAP_HTTPS=1
    assert client.get("/admin/auth/user/").status_code == 200


def site_settings(data_dir, **env) -> dict:
    """Settings as a fresh process reads them from the environment (only the LLAMASWAP_* given here)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("LLAMASWAP_") and k != "DJANGO_SETTINGS_MODULE"}
    probe = (
        "import json, django; django.setup(); from django.conf import settings as s; "
        "print(json.dumps({n: getattr(s, n, None) for n in ['DEBUG', 'SECRET_KEY', 'SESSION_COOKIE_SECURE', "
        "'SESSION_COOKIE_HTTPONLY', 'CSRF_COOKIE_SECURE', 'SECURE_HSTS_SECONDS', 'SECURE_SSL_REDIRECT', "
        "'SECURE_PROXY_SSL_HEADER', 'ALLOWED_HOSTS']}))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=60, check=True,
        env={**base, "DJANGO_SETTINGS_MODULE": "llamaswap_site.settings", "LLAMASWAP_DATA_DIR": str(data_dir), **env},
    )
    return json.loads(result.stdout)


@pytest.mark.parametrize("value,debug", [(None, False), ("1", True), ("0", False), ("true", False), ("", False)])
def test_debug_is_off_unless_llamaswap_debug_is_1(tmp_path, value, debug):
    env = {} if value is None else {"LLAMASWAP_DEBUG": value}
    assert site_settings(tmp_path, **env)["DEBUG"] is debug


def test_the_secret_key_is_made_once_per_install_private_and_reused(tmp_path):
    first = site_settings(tmp_path / "one")["SECRET_KEY"]
    key_file = tmp_path / "one" / "secret_key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert key_file.read_text().strip() == first and len(first) >= 50
    assert site_settings(tmp_path / "one")["SECRET_KEY"] == first
    assert site_settings(tmp_path / "two")["SECRET_KEY"] != first
    assert stat.S_IMODE((tmp_path / "one").stat().st_mode) == 0o700  # the request history is private too
    assert [p.name for p in (tmp_path / "one").iterdir() if p.name.startswith(".")] == []  # no temp file left


def test_processes_starting_at_once_agree_on_one_secret_key(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    from llamaswap_site.environment import load_or_create_secret_key

    with ThreadPoolExecutor(8) as pool:
        keys = set(pool.map(lambda _: load_or_create_secret_key(tmp_path / "secret_key"), range(8)))
    assert len(keys) == 1


def test_https_hardening_is_on_only_with_llamaswap_https(tmp_path):
    plain = site_settings(tmp_path)
    assert plain["SESSION_COOKIE_HTTPONLY"] is True
    assert (plain["SESSION_COOKIE_SECURE"], plain["CSRF_COOKIE_SECURE"], plain["SECURE_SSL_REDIRECT"]) == (False,) * 3
    assert plain["SECURE_HSTS_SECONDS"] == 0
    assert plain["SECURE_PROXY_SSL_HEADER"] is None  # a client talking straight to daphne cannot claim HTTPS
    https = site_settings(tmp_path, LLAMASWAP_HTTPS="1")
    assert (https["SESSION_COOKIE_SECURE"], https["CSRF_COOKIE_SECURE"], https["SECURE_SSL_REDIRECT"]) == (True,) * 3
    assert https["SECURE_HSTS_SECONDS"] >= 31536000
    assert https["SECURE_PROXY_SSL_HEADER"] == ["HTTP_X_FORWARDED_PROTO", "https"]


def test_check_deploy_passes_for_a_production_environment(tmp_path):
    base = {k: v for k, v in os.environ.items() if not k.startswith("LLAMASWAP_")}
    env = {**base, "LLAMASWAP_DATA_DIR": str(tmp_path), "LLAMASWAP_HTTPS": "1",
           "LLAMASWAP_ALLOWED_HOSTS": "llm.example.org"}
    result = subprocess.run(
        [sys.executable, str(REPO / "manage.py"), "check", "--deploy", "--fail-level", "WARNING"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.e2e
def test_behind_a_tls_proxy_the_admin_is_https_only_and_its_cookies_secure(tmp_path):
    text = f"""
        models:
          m:
            cmd: {fake_cmd("m", None, "--tps", "0")}
            proxy: http://127.0.0.1:${{PORT}}
    """
    with Served(tmp_path, text, env={"LLAMASWAP_HTTPS": "1"}) as served:
        subprocess.run(
            [sys.executable, str(REPO / "manage.py"), "createsuperuser", "--noinput", "--username", "operator",
             "--email", "operator@example.com"],
            cwd=REPO, env={**served.env, "DJANGO_SUPERUSER_PASSWORD": "pw-operator-1"}, check=True,
            capture_output=True, timeout=60,
        )
        assert httpx.get(served.base + "/health").status_code == 200  # load balancers probe over plain HTTP
        redirected = httpx.get(served.base + "/admin/login/")
        assert redirected.status_code == 301 and redirected.headers["location"].startswith("https://")
        # The TLS proxy in front says "https"; the client sends Secure cookies by hand, as a browser would over HTTPS.
        https_origin = served.base.replace("http://", "https://")
        with httpx.Client(base_url=served.base, headers={"X-Forwarded-Proto": "https"}, timeout=30) as browser:
            form = browser.get("/admin/login/")
            assert form.status_code == 200
            assert form.headers["strict-transport-security"].startswith("max-age=")
            csrf_cookie = next(c for c in form.headers.get_list("set-cookie") if c.startswith("csrftoken="))
            assert "Secure" in csrf_cookie
            token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form.text).group(1)
            logged_in = browser.post(
                "/admin/login/",
                data={"username": "operator", "password": "pw-operator-1", "csrfmiddlewaretoken": token,
                      "next": "/admin/"},
                headers={"Cookie": csrf_cookie.split(";", 1)[0], "Referer": https_origin + "/admin/login/",
                         "Origin": https_origin},
            )
            assert logged_in.status_code == 302, logged_in.text[:500]
            session = next(c for c in logged_in.headers.get_list("set-cookie") if c.startswith("sessionid="))
            assert "HttpOnly" in session and "Secure" in session
