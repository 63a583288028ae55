"""Served on the LAN: the names and addresses users reach the machine by are accepted, any other Host is not.

Only loopback is reachable here, so requests go to 127.0.0.1 and carry the Host header a client on
another machine would send.
"""

from __future__ import annotations

import fcntl
import socket
import struct

import httpx
import pytest

from tests.served import Served, fake_cmd

pytestmark = pytest.mark.e2e

SIOCGIFADDR = 0x8915
FOREIGN = "rebind.example"


def config() -> str:
    return f"""
        models:
          m:
            cmd: {fake_cmd("m", None, "--tps", "0", "--tokens", "2")}
            proxy: http://127.0.0.1:${{PORT}}
    """


def lan_addresses() -> list[str]:
    """This machine's IPv4 addresses beyond loopback, asked of the kernel interface by interface."""
    found = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for _, name in socket.if_nameindex():
            try:
                answer = fcntl.ioctl(probe.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue  # an interface without an IPv4 address
            address = socket.inet_ntoa(answer[20:24])
            if not address.startswith("127."):
                found.append(address)
    return found


def served_on_all_interfaces(tmp_path, env: dict | None = None) -> Served:
    served = Served(tmp_path, config(), env=env)
    served.extra_args = ("--listen", f"0.0.0.0:{served.port}")
    return served


def get(served: Served, path: str, host: str) -> httpx.Response:
    return httpx.get(served.base + path, headers={"Host": host}, timeout=30)


def chat(served: Served, host: str) -> httpx.Response:
    return httpx.post(served.base + "/v1/chat/completions", headers={"Host": host}, timeout=60,
                      json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})


def assert_refused(response: httpx.Response, host: str) -> None:
    assert response.status_code == 400, response.text
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert error["code"] == "host_not_allowed"
    assert host in error["message"] and "LLAMASWAP_ALLOWED_HOSTS" in error["message"]
    assert "ALLOWED_HOSTS" not in error["message"].replace("LLAMASWAP_ALLOWED_HOSTS", "")


def test_listening_on_all_interfaces_accepts_the_machines_names_and_addresses(tmp_path):
    hostname = socket.gethostname().lower()
    names = [hostname, f"{hostname.split('.')[0]}.local", "localhost", *lan_addresses()]
    with served_on_all_interfaces(tmp_path, env={"LLAMASWAP_ALLOWED_HOSTS": "llm.example"}) as served:
        for name in [*names, "llm.example"]:
            host = f"{name}:{served.port}"
            assert get(served, "/v1/models", host).status_code == 200, host
            assert get(served, "/admin/login/", host).status_code == 200, host
            assert chat(served, host).status_code == 200, host
        banner = next(line for line in served.log().splitlines() if line.startswith("Host names accepted:"))
        assert all(name in banner for name in [*names, "llm.example"]), banner
        assert "LLAMASWAP_ALLOWED_HOSTS" in banner


def test_listening_on_all_interfaces_still_refuses_other_names_with_the_variable_to_set(tmp_path):
    with served_on_all_interfaces(tmp_path) as served:
        host = f"{FOREIGN}:{served.port}"
        assert_refused(chat(served, host), FOREIGN)
        assert_refused(get(served, "/v1/models", host), FOREIGN)
        assert_refused(get(served, "/admin/login/", host), FOREIGN)
        assert_refused(get(served, "/no-such-route", host), FOREIGN)
        # /health answers whatever name a load balancer or a container health check uses.
        health = get(served, "/health", "health-probe.internal")
        assert health.status_code == 200 and health.text == "OK"


def test_a_loopback_listener_refuses_the_machines_lan_names(tmp_path):
    """DNS rebinding protection: on 127.0.0.1 only loopback names are served."""
    with Served(tmp_path, config()) as served:
        for name in [socket.gethostname().lower(), *lan_addresses(), FOREIGN]:
            assert_refused(chat(served, f"{name}:{served.port}"), name)
            assert_refused(get(served, "/v1/models", f"{name}:{served.port}"), name)
        assert chat(served, f"localhost:{served.port}").status_code == 200
        assert get(served, "/health", FOREIGN).status_code == 200


def test_allowed_hosts_star_accepts_any_name_and_warns_without_api_keys(tmp_path):
    with served_on_all_interfaces(tmp_path, env={"LLAMASWAP_ALLOWED_HOSTS": "*"}) as served:
        assert chat(served, f"{FOREIGN}:{served.port}").status_code == 200
        assert get(served, "/v1/models", FOREIGN).status_code == 200
        log = served.log()
        assert "Host names accepted: any (LLAMASWAP_ALLOWED_HOSTS=*)" in log
        assert "no apiKeys are set" in log
