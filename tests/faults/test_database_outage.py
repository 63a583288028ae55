"""A PostgreSQL outage loses no row: `llamaswap serve` on PostgreSQL reached through a relay the test
cuts while requests are answered; once it is back every answered request has exactly one terminal
row saying what its client got, and the log tells of the outage once and of its end once (the
recorder's and the instance lock's lines alike)."""

from __future__ import annotations

import json
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit, urlunsplit

import httpx
import pytest
import yaml

from tests.e2e.test_peers import Peer
from tests.faults.relay import Relay
from tests.reliability.support import TERMINAL_STATES, serial_config
from tests.served import Served, fake_cmd, wait_until

pytestmark = pytest.mark.e2e

OUTAGE_S = 6.0


def through(url: str, relay: Relay) -> str:
    parts = urlsplit(url)
    userinfo = parts.netloc.rsplit("@", 1)[0] + "@" if "@" in parts.netloc else ""
    return urlunsplit(parts._replace(netloc=userinfo + relay.url_host))


def rows(url: str, psycopg) -> list[dict]:
    with psycopg.connect(url) as con:
        cursor = con.execute("SELECT * FROM scheduling_queuedrequest ORDER BY id")
        names = [column.name for column in cursor.description]
        return [dict(zip(names, row)) for row in cursor.fetchall()]


def ask(base: str, index: int, stream: bool) -> tuple[int, int]:
    """One chat request; (status, completion tokens the client was told or counted)."""
    body = {"model": "m", "messages": [{"role": "user", "content": f"hi {index}"}], "stream": stream,
            "fake": {"delay": 0.3}}
    if stream:
        body["stream_options"] = {"include_usage": True}
        with httpx.stream("POST", base + "/v1/chat/completions", json=body, timeout=60) as answer:
            usage = None
            for line in answer.iter_lines():
                if line.startswith("data: {"):
                    usage = json.loads(line[6:]).get("usage") or usage
            return answer.status_code, (usage or {}).get("completion_tokens")
    answer = httpx.post(base + "/v1/chat/completions", json=body, timeout=60)
    return answer.status_code, answer.json().get("usage", {}).get("completion_tokens")


def config() -> str:
    return serial_config({"m": {"cmd": fake_cmd("m", None, "--tps", "0", "--tokens", "3")}})


def test_a_postgresql_outage_of_seconds_loses_no_row(tmp_path, postgres):
    url, psycopg = postgres
    with Relay("127.0.0.1", urlsplit(url).port or 5432, name="postgres") as relay:
        with Served(tmp_path, config(), env={"DATABASE_URL": through(url, relay)}) as served:
            assert ask(served.base, 0, False)[0] == 200  # the model is up and the connection open
            relay.cut()
            cut_at = time.monotonic()
            answers = []
            with ThreadPoolExecutor(2) as pool:
                index = 1
                while time.monotonic() - cut_at < OUTAGE_S - 1:
                    answers += pool.map(lambda i: ask(served.base, i, i % 2 == 0), [index, index + 1])
                    index += 2
            relay.restore()
            assert answers and all(status == 200 for status, _ in answers), answers

            def settled():
                found = rows(url, psycopg)
                return found if len(found) == len(answers) + 1 and all(
                    r["state"] in TERMINAL_STATES for r in found) else None

            try:
                found = wait_until(settled, 30, 0.1, "a terminal row for every answered request")
            except AssertionError:
                raise AssertionError(f"{len(answers) + 1} answered; rows: "
                                     f"{[(r['id'], r['state']) for r in rows(url, psycopg)]}") from None
            assert [(r["state"], r["status_code"]) for r in found] == [("completed", 200)] * len(found)
            assert {tokens for _, tokens in answers} == {3}  # what each client was told, streaming or not
            assert {r["output_tokens"] for r in found} == {3}
            wait_until(lambda: "took the database lock again" in served.log(), 15, 0.1, "the lock to be taken again")
            served.check_settled("m")
        log = served.log()
    assert log.count("request history database is unreachable") == 1, log
    assert log.count("request history database is back") == 1, log
    assert "change is lost" not in log and "they are lost" not in log, log
    assert log.count("the connection holding the database lock was lost") == 1, log
    assert log.count("took the database lock again") == 1, log
    assert "trying again in" not in log, log


def test_at_the_bound_new_requests_are_refused_and_every_answered_one_is_recorded(tmp_path, postgres):
    url, psycopg = postgres
    peer = Peer(tmp_path, "p1")
    try:
        refused_at_the_bound(tmp_path, url, psycopg, peer)
    finally:
        peer.stop()


def refused_at_the_bound(tmp_path, url: str, psycopg, peer: Peer) -> None:
    with_peer = yaml.safe_load(config())
    with_peer["peers"] = {"box": {"proxy": peer.url, "models": ["p1"]}}
    with Relay("127.0.0.1", urlsplit(url).port or 5432, name="postgres") as relay:
        env = {"DATABASE_URL": through(url, relay), "LLAMASWAP_RECORDER_BACKLOG": "6"}
        with Served(tmp_path, yaml.safe_dump(with_peer), env=env) as served:
            assert ask(served.base, 0, False)[0] == 200
            relay.cut()
            answers = []
            refused = None
            deadline = time.monotonic() + 30
            while refused is None and time.monotonic() < deadline:
                body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
                answer = httpx.post(served.base + "/v1/chat/completions", json=body, timeout=60)
                if answer.status_code == 503:
                    refused = answer
                else:
                    answers.append(answer.status_code)
            assert refused is not None, "never refused while the database was away"
            error = refused.json()["error"]
            assert error["code"] == "request_history_unreachable" and "database" in error["message"], error
            assert answers and set(answers) == {200}
            to_peer = httpx.post(served.base + "/v1/chat/completions", timeout=60,
                                 json={"model": "box/p1", "messages": [{"role": "user", "content": "hi"}]})
            assert (to_peer.status_code, to_peer.json()["error"]["code"]) == (503, "request_history_unreachable")
            assert to_peer.headers["Retry-After"] == "5"
            assert not peer.starts()  # the peer was never asked
            relay.restore()
            expected = len(answers) + 1  # the refused request has no row: it never entered the queue
            found = wait_until(lambda: (lambda r: r if len(r) >= expected and all(
                x["state"] in TERMINAL_STATES for x in r) else None)(rows(url, psycopg)), 30, 0.1, "rows")
            assert [r["state"] for r in found] == ["completed"] * expected
            served.check_settled("m")  # normal again


def test_after_a_database_blink_profiles_still_route_and_a_reload_still_applies(tmp_path, postgres):
    """A config with profiles reads the active one from the database on requests; a reload reads the admin's
    settings and resets the profile. After PostgreSQL blinked, both open a new connection instead of failing
    on the one the blink broke (every request 500, every reload lost, until a restart)."""
    url, _ = postgres
    with_profiles = yaml.safe_load(config())
    with_profiles["apiKeys"] = ["sk-first"]
    with_profiles["profiles"] = {"night": {"pins": {"m": "m"}}}
    key = {"Authorization": "Bearer sk-first"}
    with Relay("127.0.0.1", urlsplit(url).port or 5432, name="postgres") as relay:
        with Served(tmp_path, yaml.safe_dump(with_profiles), env={"DATABASE_URL": through(url, relay)}) as served:
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
            assert httpx.post(served.base + "/v1/chat/completions", json=body, headers=key, timeout=30).status_code == 200
            relay.cut()
            during = httpx.post(served.base + "/v1/chat/completions", json=body, headers=key, timeout=30)
            time.sleep(1.5)  # past the profile's re-read interval, on the broken connection
            relay.restore()
            assert during.status_code == 200, during.text
            after = [httpx.post(served.base + "/v1/chat/completions", json=body, headers=key, timeout=30)
                     for _ in range(3)]
            assert [a.status_code for a in after] == [200] * 3, [a.text for a in after]
            with_profiles["apiKeys"].append("sk-second")
            served.config_path.write_text(yaml.safe_dump(with_profiles))
            served.proc.send_signal(signal.SIGHUP)
            wait_until(lambda: "config reloaded" in served.log(), 15, 0.1, "the reload after the blink")
            second = {"Authorization": "Bearer sk-second"}
            assert httpx.post(served.base + "/v1/chat/completions", json=body, headers=second, timeout=30).status_code == 200
            assert "internal_error" not in served.log() and "unexpected failure" not in served.log(), served.log()
