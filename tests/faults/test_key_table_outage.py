"""The API key table while PostgreSQL is away: `llamaswap serve` reaches its database through a relay the test
cuts. The last good key rows answer meanwhile — a known key is served without waiting on the database, a wrong
one is refused, nothing crashes — the log says so once, and once the database is back a key revoked during the
outage is refused within 2 s."""

from __future__ import annotations

import time
from urllib.parse import urlsplit

import httpx
import pytest

from tests.e2e.test_api_keys import chat, keys, new_key
from tests.faults.relay import Relay
from tests.faults.test_database_outage import through
from tests.reliability.support import serial_config
from tests.served import Served, fake_cmd, wait_until

pytestmark = pytest.mark.e2e


def test_a_database_outage_keeps_the_last_good_keys_and_a_revocation_counts_once_it_is_back(tmp_path, postgres):
    url, _ = postgres
    config = serial_config({"m": {"cmd": fake_cmd("m", None, "--tps", "0", "--tokens", "3")}})
    with Relay("127.0.0.1", urlsplit(url).port or 5432, name="postgres") as relay:
        with Served(tmp_path, config, env={"DATABASE_URL": through(url, relay)}) as served:
            direct = Served(tmp_path, config, env={"DATABASE_URL": url})  # for the commands only: never started
            secret = new_key(direct, "app")
            wait_until(lambda: chat(served, "m", None).status_code == 401, 2.0, 0.05, "the key table read")
            assert chat(served, "m", secret).status_code == 200
            relay.cut()
            keys(direct, "revoke", "app")  # the served instance cannot see this until the database is back
            cut_at = time.monotonic()
            while time.monotonic() - cut_at < 3.0:
                began = time.monotonic()
                assert chat(served, "m", secret).status_code == 200  # the last good rows answer
                assert chat(served, "m", "lsk-not-a-key").status_code == 401
                assert chat(served, "m", None).status_code == 401
                assert time.monotonic() - began < 1.5  # at most one request waited on a read, READ_WAIT_S
            wait_until(lambda: "reading the API key table" in served.log(), 5, 0.05, "the outage in the log")
            relay.restore()
            deadline = time.monotonic() + 2.0 + 1.0  # 2 s, plus a read on a new connection
            wait_until(lambda: chat(served, "m", secret).status_code == 401, deadline - time.monotonic(), 0.05,
                       "the key revoked during the outage refused")
            wait_until(lambda: "answer, 300 s at most) works again" in served.log(), 5, 0.05, "the end in the log")
            log = served.log()
    assert log.count("reading the API key table (") == 2 and "Traceback" not in log, log  # its start and its end
    assert secret not in log
