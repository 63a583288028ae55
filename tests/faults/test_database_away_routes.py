"""The routes that read or write rows while PostgreSQL is away: `llamaswap serve` on PostgreSQL reached through a
relay the test cuts. Each answers 503 `database_unreachable` with `Retry-After` and says why (the database), never a
500; the model requests go on, and once the database is back every route answers again."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

import httpx
import pytest
import yaml

from proxy.api.unavailable import DATABASE_RETRY_AFTER_S
from tests.faults.relay import Relay
from tests.faults.test_database_outage import through
from tests.reliability.support import chat, serial_config
from tests.served import Served, fake_cmd, wait_until

pytestmark = pytest.mark.e2e


def config_text() -> str:
    """One model placed by memory, so leases can be taken."""
    text = yaml.safe_load(serial_config({"m": {"cmd": fake_cmd("m", None, "--tps", "0"), "memory": "8GiB"}}))
    return yaml.safe_dump({**text, "hardware": {"gpus": [{"id": 0, "memory": "24GiB"}]}}, sort_keys=False)


def test_each_route_that_needs_the_database_answers_503_with_retry_after_while_it_is_away(tmp_path, postgres):
    url, _ = postgres
    with Relay("127.0.0.1", urlsplit(url).port or 5432, name="postgres") as relay:
        with Served(tmp_path, config_text(), env={"DATABASE_URL": through(url, relay)}) as served:
            answered = chat(served.base, "m")
            assert answered.status_code == 200, answered.text
            request_id = answered.headers["x-llamaswap-request-id"]
            wait_until(lambda: httpx.get(served.base + f"/api/queue/{request_id}").json().get("state") == "completed",
                       10, 0.05, "the request's row written")
            lease = httpx.post(served.base + "/api/leases", json={"model": "m", "seconds": 600})
            assert lease.status_code == 201, lease.text
            routes = [
                ("GET", "/api/leases", None), ("POST", "/api/leases", {"model": "m", "seconds": 60}),
                ("DELETE", f"/api/leases/{lease.json()['id']}", None),
                ("GET", "/v1/files", None), ("GET", "/v1/batches", None),
                ("POST", "/v1/batches", {"input_file_id": "file-x", "endpoint": "/v1/chat/completions",
                                         "completion_window": "24h"}),
                ("GET", "/api/activity", None), ("GET", "/api/metrics/activity", None),
                ("GET", f"/api/queue/{request_id}", None),
            ]

            def asked(route):
                method, path, body = route
                return httpx.request(method, served.base + path, json=body, timeout=30)

            relay.cut()
            try:
                with ThreadPoolExecutor(len(routes)) as pool:
                    answers = list(pool.map(asked, routes))
                assert chat(served.base, "m").status_code == 200, "model requests go on without the database"
            finally:
                relay.restore()
            for (method, path, _), answer in zip(routes, answers):
                assert answer.status_code == 503, (method, path, answer.status_code, answer.text)
                assert answer.headers.get("retry-after") == str(DATABASE_RETRY_AFTER_S), (method, path, answer.headers)
                error = answer.json()["error"]
                assert error["code"] == "database_unreachable", (method, path, error)
                assert error["message"].startswith("the database is unreachable"), (method, path, error)
                assert "127.0.0.1" not in error["message"], "the database's address stays in the log"
            wait_until(lambda: all(asked(route).status_code < 500 for route in routes[:1] + routes[3:]), 10, 0.1,
                       "every route answering again once the database is back")
            assert "Traceback" not in served.log(), served.log()
