"""A PostgreSQL outage loses no row: `llamaswap serve` on PostgreSQL reached through a relay the test
cuts while requests are answered; within about 2 s of its return every answered request has exactly one
terminal row, found by the request id its client was told, saying what that client got; the lock is taken
again as soon, and the log tells of the outage once and of its end once (the recorder's and the instance
lock's lines alike)."""

from __future__ import annotations

import json
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple
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


def rows(url: str, psycopg) -> dict[int, dict]:
    """Every request row, by its id (the `x-llamaswap-request-id` its client was told)."""
    with psycopg.connect(url) as con:
        cursor = con.execute("SELECT * FROM scheduling_queuedrequest ORDER BY id")
        names = [column.name for column in cursor.description]
        return {row[0]: dict(zip(names, row)) for row in cursor.fetchall()}


class Answer(NamedTuple):
    id: int | None  # the request id its client was told (none when it was refused before it was queued)
    status: int
    stream: bool
    tokens: int | None  # the completion tokens the client was told


def ask(base: str, index: int, stream: bool) -> Answer:
    body = {"model": "m", "messages": [{"role": "user", "content": f"hi {index}"}], "stream": stream,
            "fake": {"delay": 0.3}}
    if stream:
        body["stream_options"] = {"include_usage": True}
        with httpx.stream("POST", base + "/v1/chat/completions", json=body, timeout=60) as answer:
            usage = None
            for line in answer.iter_lines():
                if line.startswith("data: {"):
                    usage = json.loads(line[6:]).get("usage") or usage
            return Answer(request_id(answer), answer.status_code, True, (usage or {}).get("completion_tokens"))
    answer = httpx.post(base + "/v1/chat/completions", json=body, timeout=60)
    return Answer(request_id(answer), answer.status_code, False,
                  answer.json().get("usage", {}).get("completion_tokens"))


def request_id(answer: httpx.Response) -> int | None:
    told = answer.headers.get("x-llamaswap-request-id")
    return None if told is None else int(told)


# docs/guarantees.md: once the database is back, its rows are written "within about 2 s" (the recorder's longest
# backoff) and the lock is retaken "within 2 s" (its watchdog's round); "about" is a second more, for the writing.
WITHIN_ABOUT_2_S = 3.0


def recorded_soon_after(back_at: float, url: str, psycopg, answers: list[Answer]) -> dict[int, dict]:
    """The rows once each answered request has its terminal row, found by the id its client was told, and no other
    row is there: polled until about 2 s after the database came back (`back_at`), then a failure showing both."""
    asked = {answer.id for answer in answers}

    def settled():
        found = rows(url, psycopg)
        return found if set(found) == asked and all(r["state"] in TERMINAL_STATES for r in found.values()) else None

    try:
        return wait_until(settled, back_at + WITHIN_ABOUT_2_S - time.monotonic(), 0.05,
                          "a terminal row for each answered request")
    except AssertionError:
        raise AssertionError(f"{time.monotonic() - back_at:.1f} s after the database came back: asked {sorted(asked)}; "
                             f"rows {[(i, r['state']) for i, r in rows(url, psycopg).items()]}") from None


def config() -> str:
    return serial_config({"m": {"cmd": fake_cmd("m", None, "--tps", "0", "--tokens", "3")}})


def test_a_postgresql_outage_of_seconds_loses_no_row(tmp_path, postgres):
    url, psycopg = postgres
    with Relay("127.0.0.1", urlsplit(url).port or 5432, name="postgres") as relay:
        with Served(tmp_path, config(), env={"DATABASE_URL": through(url, relay)}) as served:
            answers = [ask(served.base, 0, False)]  # the model is up and the connection open
            relay.cut()
            cut_at = time.monotonic()
            with ThreadPoolExecutor(2) as pool:
                index = 1
                while time.monotonic() - cut_at < OUTAGE_S - 1:
                    answers += pool.map(lambda i: ask(served.base, i, i % 2 == 0), [index, index + 1])
                    index += 2
            relay.restore()
            back_at = time.monotonic()
            assert len(answers) > 1 and {a.status for a in answers} == {200}, answers
            assert {a.tokens for a in answers} == {3}  # what each client was told, streaming or not
            found = recorded_soon_after(back_at, url, psycopg, answers)
            assert {a.id: (found[a.id]["state"], found[a.id]["status_code"], found[a.id]["stream"],
                           found[a.id]["output_tokens"]) for a in answers} == {
                a.id: ("completed", 200, a.stream, a.tokens) for a in answers}
            wait_until(lambda: "took the database lock again" in served.log(),
                       back_at + WITHIN_ABOUT_2_S - time.monotonic(), 0.05, "the lock to be taken again")
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
            answers = [ask(served.base, 0, False)]
            relay.cut()
            refused = None
            deadline = time.monotonic() + 30
            while refused is None and time.monotonic() < deadline:
                body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
                answer = httpx.post(served.base + "/v1/chat/completions", json=body, timeout=60)
                if answer.status_code == 503:
                    refused = answer
                else:
                    answers.append(Answer(request_id(answer), answer.status_code, False,
                                          answer.json().get("usage", {}).get("completion_tokens")))
            assert refused is not None, "never refused while the database was away"
            error = refused.json()["error"]
            assert error["code"] == "request_history_unreachable" and "database" in error["message"], error
            assert len(answers) > 1 and {a.status for a in answers} == {200}, answers
            to_peer = httpx.post(served.base + "/v1/chat/completions", timeout=60,
                                 json={"model": "box/p1", "messages": [{"role": "user", "content": "hi"}]})
            assert (to_peer.status_code, to_peer.json()["error"]["code"]) == (503, "request_history_unreachable")
            assert to_peer.headers["Retry-After"] == "5"
            assert not peer.starts()  # the peer was never asked
            relay.restore()
            # each answered request has its row; the refused ones have none: they never entered the queue
            found = recorded_soon_after(time.monotonic(), url, psycopg, answers)
            assert {i: (r["state"], r["output_tokens"]) for i, r in found.items()} == {
                a.id: ("completed", a.tokens) for a in answers}
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
