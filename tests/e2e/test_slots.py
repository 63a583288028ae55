"""A model whose server takes two requests at once (`slots: 2`, the fake model with `--parallel 2`) runs two
jobs at once and never three: the third waits in llamaswap's queue, not in the model server's."""

from __future__ import annotations

from datetime import datetime, timezone

import httpx
import pytest

from tests.admin.session import AdminSession, create_superuser
from tests.e2e.held import HeldRequest, HeldStream, model_events
from tests.served import Served, fake_cmd, read_events, wait_until

pytestmark = pytest.mark.e2e


def config(events, slots: str = "{assistant: 2}") -> str:
    return f"""
        healthCheckTimeout: 20
        models:
          chat:
            cmd: {fake_cmd("chat", events, "--parallel", "2")}
            aliases: [assistant]
        routing:
          scheduler:
            use: serial
            settings:
              serial: {{slots: {slots}}}
    """


def starts(events) -> dict[str, int]:
    """Each request that reached the model server, with how many it was serving at that moment."""
    return {e["id"]: e["in_flight"] for e in read_events(events) if e["event"] == "start"}


def slot_metrics(served) -> tuple[float, float]:
    text = httpx.get(served.base + "/metrics", timeout=10).text
    values = {}
    for line in text.splitlines():
        for name in ("llamaswap_model_slots_in_use", "llamaswap_model_slots"):
            if line.startswith(name + '{model="chat"}'):
                values[name] = float(line.rsplit(" ", 1)[1])
    return values["llamaswap_model_slots_in_use"], values["llamaswap_model_slots"]


def test_two_slots_run_two_jobs_at_once_and_the_third_waits_for_a_free_one(tmp_path, rows):
    events = tmp_path / "events.jsonl"
    with Served(tmp_path, config(events)) as served:
        first = HeldStream(served, "chat", tokens=100_000, tps=20, request_id="first")
        second = HeldStream(served, "chat", tokens=100_000, tps=20, request_id="second")
        assert starts(events) == {"first": 1, "second": 2}  # both stream at once
        assert slot_metrics(served) == (2.0, 2.0)

        third = HeldRequest(served, "chat", tokens=3, tps=0, request_id="third")
        wait_until(lambda: rows(served.data_dir, "state='queued'"), what="the third request to queue")
        assert "third" not in starts(events)

        first.close()  # frees slot 1: the third takes it
        assert third.result().status_code == 200
        assert second.response.status_code == 200 and "[DONE]" not in second.payloads
        second.close()

        assert starts(events) == {"first": 1, "second": 2, "third": 2}
        finished = wait_until(
            lambda: (found := rows(served.data_dir, "state IN ('completed', 'cancelled', 'failed')"))
            and len(found) == 3 and found,
            what="all three rows to finish",
        )
        assert [row["slot"] for row in finished] == [1, 2, 1]
        # llamaswap never sent the server a request it had no free slot for. The server may hold the third back
        # for the moment it takes to notice the first's connection closed, but it got it only once llamaswap had
        # closed that connection and freed the slot.
        freed = datetime.fromisoformat(finished[0]["finished_at"]).replace(tzinfo=timezone.utc).timestamp()
        held_back = [e for e in read_events(events) if e["event"] == "queued"]
        assert all(e["id"] == "third" and e["t"] >= freed - 0.001 for e in held_back), (held_back, freed)
        wait_until(lambda: slot_metrics(served) == (0.0, 2.0), what="the slots to be free again")


def test_slots_given_in_the_admin_free_a_waiting_request_at_once(tmp_path, rows):
    events = tmp_path / "events.jsonl"
    with Served(tmp_path, config(events, slots="{}")) as served:
        create_superuser(served, "alice", "correct-horse-battery")
        admin = AdminSession(served, "alice", "correct-horse-battery")
        running = HeldStream(served, "chat", tokens=100_000, tps=20, request_id="running")
        waiting = HeldRequest(served, "chat", tokens=3, tps=0, request_id="waiting")
        wait_until(lambda: rows(served.data_dir, "state='queued'"), what="the second request to queue behind one slot")

        saved = admin.post("/admin/scheduling/schedulersettings/1/change/",
                           {"aging_divisor": "", "swap_affinity_bonus": "", "slots": "assistant: 2", "_save": "Save"})
        assert saved.status_code == 302
        assert waiting.result().status_code == 200  # it ran on the second slot, beside the running stream
        assert model_events(events, "running") == ["start"]
        assert starts(events) == {"running": 1, "waiting": 2}
        running.close()
        admin.close()
