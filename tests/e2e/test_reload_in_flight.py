"""A config reload never cuts the request a model is serving: it finishes on the old process, whole,
and only then is the old process replaced (or removed)."""

from __future__ import annotations

import httpx
import pytest

from tests.e2e.held import HeldRequest, HeldStream, model_events, sighup_reload, wait_for_model_to_start
from tests.served import Served, fake_cmd, wait_until

pytestmark = pytest.mark.e2e

TOKENS = 40
TPS = 10  # the held request takes TOKENS / TPS seconds, far longer than a reload


def models_yaml(events, served_as: dict[str, str]) -> str:
    """`model id: name the fake server answers as`; a new name is a changed `cmd`."""
    lines = ["healthCheckTimeout: 20", "models:"]
    for model, name in served_as.items():
        lines += [f"  {model}:", f"    cmd: {fake_cmd(name, events)}"]
    return "\n".join(lines) + "\nrouting:\n  scheduler:\n    use: serial\n"


def chat(served, model):
    return httpx.post(served.base + "/v1/chat/completions", json={"model": model, "messages": []}, timeout=60)


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "non-stream"])
@pytest.mark.parametrize("change", ["cmd", "removal"])
def test_a_request_in_flight_finishes_whole_across_a_reload(tmp_path, rows, stream, change):
    events = tmp_path / "events.jsonl"
    with Served(tmp_path, models_yaml(events, {"m": "m-old", "other": "other"})) as served:
        held = (HeldStream if stream else HeldRequest)(served, "m", tokens=TOKENS, tps=TPS, request_id="held")
        wait_for_model_to_start(events, "held")

        after = {"m": "m-new", "other": "other"} if change == "cmd" else {"other": "other"}
        sighup_reload(served, models_yaml(events, after))
        assert "end" not in model_events(events, "held"), "the held request finished before the reload; nothing tested"
        assert f"{'restarting m' if change == 'cmd' else 'removed m'}" in served.log()

        if stream:
            payloads = held.read_to_end()
            assert payloads[-1] == "[DONE]"
            assert not [c for c in held.chunks() if "error" in c], held.payloads
            assert len(held.text().split()) == TOKENS
            assert {c["model"] for c in held.chunks()} == {"m-old"}
        else:
            response = held.result()
            assert response.status_code == 200, response.text
            assert len(response.json()["choices"][0]["message"]["content"].split()) == TOKENS
            assert response.json()["model"] == "m-old"
        row = wait_until(lambda: [r for r in rows(served.data_dir) if r["state"] != "dispatched"], what="the row")[0]
        assert (row["state"], row["status_code"], row["error"]) == ("completed", 200, "")

        after_reload = chat(served, "m")
        if change == "cmd":
            assert after_reload.status_code == 200 and after_reload.json()["model"] == "m-new"
        else:
            assert after_reload.status_code == 404 and after_reload.json()["error"]["code"] == "model_not_found"
        served.check_settled("m" if change == "cmd" else "other")
