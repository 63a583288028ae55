"""A model started while PostgreSQL was away was never recorded (records are written behind): if its
service is then killed, the next owner of the data still stops it, by the owner its environment names,
instead of answering every request for that model "port in use" — and never stops a live service's."""

from __future__ import annotations

import os
import subprocess
from urllib.parse import urlsplit

import httpx
import pytest
import yaml

from proxy.model_processes import proctable
from tests.faults.cluster import MODEL, SERVING, Cluster
from tests.faults.relay import Relay
from tests.faults.test_database_outage import through
from tests.reliability.support import chat, model_pgid, serial_config
from tests.served import Served, fake_cmd, wait_until

pytestmark = pytest.mark.e2e


def config() -> str:
    swapping = yaml.safe_load(serial_config({name: {"cmd": fake_cmd(name)} for name in ("chat", "other")}))
    swapping["groups"] = {"one-at-a-time": {"swap": True, "members": ["chat", "other"]}}
    return yaml.safe_dump(swapping)


def listening(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def test_a_model_started_during_a_database_outage_is_stopped_after_a_kill(tmp_path, postgres):
    url, _ = postgres
    with Relay("127.0.0.1", urlsplit(url).port or 5432, name="postgres") as relay:
        with Served(tmp_path, config(), env={"DATABASE_URL": through(url, relay)}) as served:
            assert chat(served.base, "other").status_code == 200
            relay.cut()
            assert chat(served.base, "chat").status_code == 200  # a swap: `chat` starts, unrecorded
            chat_port = yaml.safe_load(served.config_path.read_text())["startPort"]  # the first model's
            served.kill()
            relay.restore()
            assert listening(chat_port)  # the dead run's model still holds its port
            served.start(60)
            answer = chat(served.base, "chat")
            assert answer.status_code == 200, answer.text
            assert "left running by a previous run" in served.log(), served.log()
            served.check_settled("chat")


def test_the_standby_stops_what_a_worker_started_during_a_database_outage(tmp_path, postgres, redis_url):
    url, _ = postgres
    cluster = Cluster(tmp_path, "distributed", url, redis_url).start()
    try:
        active, standby = cluster.workers
        front_end = cluster.front_ends[0]
        active.relays["postgres"].cut()
        assert chat(front_end.handle.base, MODEL).status_code == 200  # started, never recorded
        active.kill()
        active.relays["postgres"].restore()
        wait_until(lambda: SERVING in standby.log(), 30, 0.05, "the standby to take over")
        answer = chat(front_end.handle.base, MODEL)
        assert answer.status_code == 200, answer.text
        assert "left running by a previous run" in standby.log(), standby.log()
        front_end.handle.check_settled(MODEL)
    finally:
        cluster.close()


def owner_of(pid: int) -> str:
    environ = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
    return next(item for item in environ if item.startswith(b"LLAMASWAP_PROCESS_OWNER=")).decode().split("=", 1)[1]


def owned_by(owner: str) -> subprocess.Popen:
    return subprocess.Popen(["sleep", "300"], start_new_session=True,
                            env={**os.environ, "LLAMASWAP_PROCESS_OWNER": owner})


def test_only_this_data_processes_whose_owner_is_gone_are_stopped(tmp_path):
    """A process naming this data and a live owner, or another data and a dead owner, survives a start-up."""
    served = Served(tmp_path, config()).start(60)
    assert chat(served.base, "chat").status_code == 200
    data = owner_of(model_pgid(served.data_dir, "chat")).split(" ")[0]  # the group's leader is the model
    assert served.stop() == 0
    ended = subprocess.Popen(["true"])
    ended.wait()  # its pid names an owner that is gone
    me = f"{os.getpid()} {proctable.start_ticks(os.getpid())}"
    orphan = owned_by(f"{data} {ended.pid} 1 chat")
    live = owned_by(f"{data} {me} chat")
    elsewhere = owned_by(f"{'0' * 16} {ended.pid} 1 chat")
    try:
        served.start(60)
        assert orphan.wait(timeout=10) == -15
        assert live.poll() is None and elsewhere.poll() is None
        assert f"stopped process group {orphan.pid} of model chat, left running by a previous run" in served.log()
    finally:
        served.stop()
        for process in (orphan, live, elsewhere):
            process.kill()
            process.wait()

