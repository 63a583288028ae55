"""The non-proxied routes never fail on a model the config no longer has: one a reload removed that is
still serving or stopping, or a config with no models at all."""

from __future__ import annotations

import httpx
import pytest

from tests.admin.session import AdminSession, cell, create_superuser
from tests.e2e.held import HeldStream, sighup_reload
from tests.served import Served, fake_cmd, wait_until

pytestmark = pytest.mark.e2e


def models_yaml(models) -> str:
    """`${PORT}`s go to the models in id order: the model kept sorts first, so its port stays."""
    lines = ["models:"]
    for model in models:
        lines += [f"  {model}:", f"    cmd: {fake_cmd(model)}"]
    return "\n".join(lines) + "\ngroups:\n  all:\n    swap: false\n    members: [" + ", ".join(models) + "]\n"


def test_every_view_answers_while_a_removed_model_is_still_serving(tmp_path):
    with Served(tmp_path, models_yaml(["keep", "old"])) as served:
        create_superuser(served, "alice", "correct-horse-battery")
        assert httpx.post(served.base + "/v1/chat/completions", json={"model": "keep", "messages": []}).status_code == 200
        held = HeldStream(served, "old", tokens=100_000, tps=20, request_id="held")
        try:
            sighup_reload(served, models_yaml(["keep"]))

            running = httpx.get(served.base + "/running")
            assert running.status_code == 200, running.text
            states = sorted((m["model"], m["state"]) for m in running.json()["running"])
            assert states == [("keep", "ready"), ("old", "ready")]
            assert [m["id"] for m in httpx.get(served.base + "/v1/models").json()["data"]] == ["keep"]
            metrics = httpx.get(served.base + "/metrics")
            assert metrics.status_code == 200 and 'llamaswap_model_state{model="keep",state="ready"} 1.0' in metrics.text
            logs = httpx.get(served.base + "/logs")
            assert logs.status_code == 200 and "=== old ===" in logs.text
            with httpx.stream("GET", served.base + "/logs/stream/old", timeout=10) as log_stream:
                assert log_stream.status_code == 200 and next(log_stream.iter_text())
            assert httpx.post(served.base + "/api/models/unload/old").status_code == 404
            admin = AdminSession(served, "alice", "correct-horse-battery")
            try:
                page = admin.get("/admin/scheduling/configuredmodel/")
                assert cell(page, "model-1", "state") == "ready" and 'id="model-2"' not in page
            finally:
                admin.close()
        finally:
            held.close()  # the removed model is idle now, so it stops
        wait_until(lambda: [m["model"] for m in httpx.get(served.base + "/running").json()["running"]] == ["keep"],
                   what="the removed model to stop")
        served.check_settled("keep")


def test_a_config_without_models_answers_every_route(tmp_path):
    with Served(tmp_path, "models: {}\n") as served:
        assert httpx.get(served.base + "/unload", timeout=10).text == "OK"
        assert httpx.post(served.base + "/api/models/unload", timeout=10).json() == {"msg": "ok"}
        assert httpx.get(served.base + "/running").json() == {"running": []}
        assert httpx.get(served.base + "/v1/models").json() == {"object": "list", "data": []}
        assert httpx.get(served.base + "/metrics").status_code == 200
        assert httpx.get(served.base + "/logs").status_code == 200
        chat = httpx.post(served.base + "/v1/chat/completions", json={"model": "any", "messages": []})
        assert chat.status_code == 404 and chat.json()["error"]["code"] == "model_not_found"
