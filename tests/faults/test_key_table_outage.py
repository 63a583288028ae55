"""The API key table while PostgreSQL is away: `llamaswap serve` reaches its database through a relay the test
cuts. The last good key rows answer meanwhile — a known key is served without waiting on the database, a wrong
one is refused, nothing crashes — the log says so once, and once the database is back a key revoked during the
outage is refused within 2 s."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

import pytest

from proxy.serving.key_cache import REFRESH_S
from tests.e2e.test_api_keys import chat, keys, new_key
from tests.faults.relay import Relay
from tests.faults.test_database_outage import through
from tests.reliability.support import serial_config
from tests.served import Served, fake_cmd, wait_until

pytestmark = pytest.mark.e2e


@contextlib.contextmanager
def served_through_relay(tmp_path, url: str) -> Iterator[tuple[Relay, Served, Served]]:
    """A served instance reaching the database `url` through a relay the test cuts; and one never started,
    whose environment the `llamaswap keys` commands use to reach the database directly."""
    config = serial_config({"m": {"cmd": fake_cmd("m", None, "--tps", "0", "--tokens", "3")}})
    with Relay("127.0.0.1", urlsplit(url).port or 5432, name="postgres") as relay:
        with Served(tmp_path, config, env={"DATABASE_URL": through(url, relay)}) as served:
            yield relay, served, Served(tmp_path, config, env={"DATABASE_URL": url})


def test_a_database_outage_keeps_the_last_good_keys_and_a_revocation_counts_once_it_is_back(tmp_path, postgres):
    url, _ = postgres
    with served_through_relay(tmp_path, url) as (relay, served, direct):
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


def test_an_idle_front_end_reads_the_keys_at_once_on_a_new_connection_after_a_short_outage(tmp_path, postgres):
    """The outage broke the front end's connection while no request read the rows: the first read after it
    fails on that connection and is tried again at once on a new one, so a key made after the outage is taken by
    the first burst of its requests, and the log tells of no failed read."""
    url, _ = postgres
    with served_through_relay(tmp_path, url) as (relay, served, direct):
        first = new_key(direct, "first")
        wait_until(lambda: chat(served, "m", first).status_code == 200, 2.0, 0.05, "the first key taken")
        read_at = time.monotonic()
        relay.cut()
        relay.restore()  # nobody read meanwhile
        secret = new_key(direct, "after")
        time.sleep(max(0.0, REFRESH_S - (time.monotonic() - read_at)))  # the rows last read are due again
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda _: chat(served, "m", secret).status_code, range(8)))
        assert answers == [200] * 8, served.log()
        log = served.log()
    assert "reading the API key table (" not in log and "Traceback" not in log, log
