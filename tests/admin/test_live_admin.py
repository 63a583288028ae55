"""The queue, models and settings pages against the real service: live ranks, actions, and retuning."""

from __future__ import annotations

import httpx
import pytest

from tests.admin.session import AdminSession, cell, create_superuser, queue_rows, running_rows
from tests.admin.traffic import Caller, GpuHolder, started_ids, two_model_config
from tests.served import Served, wait_until

pytestmark = pytest.mark.e2e

QUEUE = "/admin/scheduling/waitingrequest/"
MODELS = "/admin/scheduling/configuredmodel/"
SETTINGS = "/admin/scheduling/schedulersettings/1/change/"


@pytest.fixture
def served(tmp_path):
    events, text = two_model_config(tmp_path)
    with Served(tmp_path, text) as s:
        s.events = events
        create_superuser(s, "alice", "correct-horse-battery")
        yield s


@pytest.fixture
def admin(served):
    session = AdminSession(served, "alice", "correct-horse-battery")
    yield session
    session.close()


def queued(admin, count):
    def ranked():
        rows = queue_rows(admin.get(QUEUE))
        return rows if len(rows) == count else None

    return wait_until(ranked, what=f"{count} requests on the queue page")


def test_the_queue_page_ranks_waiting_requests_and_operators_cancel_and_reprioritize(served, admin):
    holder = GpuHolder(served)
    beta = Caller(served, "beta", 0, "beta")
    queued(admin, 1)
    alpha = Caller(served, "alpha", 0, "alpha")
    queued(admin, 2)
    batch = Caller(served, "alpha", "batch", "batch")
    rows = queued(admin, 3)

    # alpha is loaded, so the newer alpha request gets the affinity bonus and goes ahead of beta.
    assert [(r["rank"], r["priority"], r["affinity"], r["score"]) for r in rows] == [
        ("1", "0", "10", "10.0"), ("2", "0", "0", "0.0"), ("3", "-100", "10", "-90.0")]
    alpha_id, beta_id, batch_id = (r["ticket"] for r in rows)
    running = running_rows(admin.get(QUEUE))
    assert [(r["model"], r["slots-busy"], r["slot"], r["priority"], r["band"]) for r in running] == [
        ("alpha", "1/1", "1", "0", "normal")]
    assert running[0]["running-for"].endswith(" s") and running[0]["ticket"] < alpha_id

    response = admin.post(QUEUE, {"action": "cancel", "ticket": [beta_id]})
    assert response.status_code == 302
    status, body = beta.wait()
    assert status == 503 and "cancelled by an operator" in body["error"]["message"]

    form = admin.post(QUEUE, {"action": "reprioritize", "ticket": [batch_id]})
    assert form.status_code == 200 and "New priority" in form.text
    refused = admin.post(QUEUE, {"action": "reprioritize", "ticket": [batch_id], "apply": "1", "priority": "urgent"})
    assert refused.status_code == 200 and "&#x27;urgent&#x27; is not a priority" in refused.text
    done = admin.post(QUEUE, {"action": "reprioritize", "ticket": [batch_id], "apply": "1", "priority": "interactive"})
    assert done.status_code == 302
    rows = queue_rows(admin.get(QUEUE))
    assert [(r["ticket"], r["priority"]) for r in rows] == [(batch_id, "100"), (alpha_id, "0")]

    holder.release()
    assert batch.wait()[0] == 200 and alpha.wait()[0] == 200
    assert started_ids(served) == ["holder", "batch", "alpha"]
    assert "Nothing is running." in admin.get(QUEUE)


def test_the_models_page_shows_state_and_last_use_and_unloads(served, admin):
    page = admin.get(MODELS)
    assert cell(page, "model-1", "state") == "stopped" and cell(page, "model-1", "last-used") == "never"
    assert Caller(served, "alpha").wait()[0] == 200

    def used():
        page = admin.get(MODELS)
        return page if cell(page, "model-1", "last-used") != "never" else None

    page = wait_until(used, what="alpha's last use to be recorded")
    assert cell(page, "model-1", "state") == "ready" and cell(page, "model-2", "state") == "stopped"

    assert admin.post(MODELS, {"model": "alpha"}).status_code == 302
    wait_until(lambda: cell(admin.get(MODELS), "model-1", "state") == "stopped", what="alpha to stop")
    assert httpx.get(served.base + "/running").json() == {"running": []}


def test_a_settings_edit_reranks_the_live_queue_and_survives_a_restart(served, admin):
    holder = GpuHolder(served)
    beta = Caller(served, "beta", 0, "beta")
    queued(admin, 1)
    alpha = Caller(served, "alpha", 0, "alpha")
    rows = queued(admin, 2)
    assert [r["affinity"] for r in rows] == ["10", "0"]
    alpha_id, beta_id = rows[0]["ticket"], rows[1]["ticket"]

    saved = admin.post(SETTINGS, {"aging_divisor": "", "swap_affinity_bonus": "0", "_save": "Save"})
    assert saved.status_code == 302
    wait_until(lambda: [r["ticket"] for r in queue_rows(admin.get(QUEUE))] == [beta_id, alpha_id], timeout=2,
               what="the queue to rank by arrival once the bonus is 0")

    holder.release()
    assert beta.wait()[0] == 200 and alpha.wait()[0] == 200
    assert started_ids(served) == ["holder", "beta", "alpha"]

    served.stop()
    served.start()
    session = AdminSession(served, "alice", "correct-horse-battery")
    page = session.get(SETTINGS)
    assert cell(page, "setting-swapAffinityBonus", "in-use") == "0"
    assert cell(page, "setting-swapAffinityBonus", "config") == "10"
    assert cell(page, "setting-swapAffinityBonus", "source").startswith("admin override by alice at ")
    assert cell(page, "setting-agingDivisor", "source") == "config file"
    session.close()
