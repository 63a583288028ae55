"""`llamaswap replay` on rows written like the recorder writes them: the recording reproduced, what it
cannot tell counted, and a bad --set refused in one line."""

from __future__ import annotations

import io
import json
import textwrap
from datetime import datetime, timedelta, timezone

import pytest
from django.core.management import call_command

from scheduling.models import ApiKey, QueuedRequest
from scheduling.operating.replay_history import recorded_window

pytestmark = pytest.mark.django_db

T = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)


@pytest.fixture
def config(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(textwrap.dedent("""
        models:
          alpha:
            cmd: /bin/true --port ${PORT}
            proxy: http://127.0.0.1:${PORT}
          beta:
            cmd: /bin/true --port ${PORT}
            proxy: http://127.0.0.1:${PORT}
        routing:
          scheduler:
            use: serial
            settings:
              serial: {agingDivisor: 30, swapAffinityBonus: 5}
    """))
    return str(path)


def row(ticket_id, model, priority, arrived, *, state="completed", sent=None, decided=None, ran=None, swap=None,
        ended=None, error="", key=""):
    """A row; times in seconds after T. `decided`: when the scheduler picked it (its queue wait ends)."""
    at = lambda s: None if s is None else T + timedelta(seconds=s)  # noqa: E731
    QueuedRequest.objects.create(
        id=ticket_id, model=model, path="/v1/chat/completions", route="chat", priority=priority, state=state,
        arrived_at=at(arrived), dispatched_at=at(sent), needed_swap=swap, error=error, api_key=key,
        serial_queue_wait_ms=None if decided is None else round((decided - arrived) * 1000),
        duration_ms=None if ran is None else round(ran * 1000),
        finished_at=at(ended if ended is not None else (None if sent is None or ran is None else sent + ran)),
    )


@pytest.fixture
def recorded():
    """alpha loads in 2 s for a batch job of 10 s; an interactive request waits for it; beta then loads in
    3 s for a normal one. One client leaves while waiting; a start fails; a model has left the config."""
    row(1, "alpha", -100, 0, sent=2, decided=0, ran=10, swap=True)
    row(2, "alpha", 100, 1, sent=12, decided=12, ran=1, swap=False)
    row(3, "beta", 0, 3, sent=16, decided=13, ran=1, swap=True)
    row(4, "alpha", 0, 4, state="cancelled", ended=5, error="client disconnected while queued")
    row(5, "beta", 0, 20, state="rejected", ended=21, error="model 'beta' failed to start: boom")
    row(6, "gone", 0, 30, ran=1, sent=30, decided=30, swap=False)


def replay(config, *args) -> dict:
    out = io.StringIO()
    call_command("replay", "--config", config, "--since", T.isoformat(), "--until",
                 (T + timedelta(hours=1)).isoformat(), "--json", *args, stdout=out)
    return json.loads(out.getvalue())


def test_the_settings_in_force_reproduce_the_recording(config, recorded):
    result = replay(config)
    assert result["fidelity"] == {"compared": 3, "pairs": 2, "same_order": 1.0, "wait_error_s": 0.0}
    in_force = result["in_force"]
    assert in_force["settings"] == {"agingDivisor": 30, "swapAffinityBonus": 5, "slots": {}, "fairness": "off"}
    assert in_force["swaps"] == 2 and in_force["busy_share"] == 1.0
    assert in_force["waits"]["interactive"]["max"] == 11.0 and in_force["waits"]["normal"]["max"] == 13.0
    assert in_force["handling"] | {"left": 1, "failed_starts": 1, "unconfigured": 1} == in_force["handling"]
    assert result["window"]["requests"] == 6


def test_a_proposed_setting_is_replayed_beside_them(config, recorded):
    result = replay(config, "--set", "agingDivisor=0", "--set", "slots.beta=2")
    assert result["proposed"]["settings"] == {"agingDivisor": 0, "swapAffinityBonus": 5, "slots": {"beta": 2},
                                              "fairness": "off"}
    assert result["in_force"]["waits"] == result["proposed"]["waits"]  # nothing here turns on aging or slots


def test_fair_share_is_replayed_with_the_keys_the_rows_recorded_and_their_weights_now(config):
    """alpha runs key a's first job for 10 s while a's two more and b's one queue; with fair share b's
    goes second, ahead of a's older one. b's weight is read from its key row, as it is now."""
    ApiKey.objects.create(name="b", prefix="b", secret_hash="-", weight=3)
    row(1, "alpha", 0, 0, sent=2, decided=0, ran=10, swap=True, key="a")
    for ticket_id, (arrived, key) in enumerate([(1, "a"), (2, "a"), (3, "b")], start=2):
        sent = 10 + ticket_id * 2
        row(ticket_id, "alpha", 0, arrived, sent=sent, decided=sent, ran=2, swap=False, key=key)
    records = recorded_window(T, T + timedelta(hours=1)).records
    assert [(r.key, r.weight) for r in records] == [("a", 1), ("a", 1), ("a", 1), ("b", 3)]
    result = replay(config, "--set", "fairness=keys")
    assert result["proposed"]["settings"]["fairness"] == "keys"
    assert result["in_force"]["reorders"]["fair_share"] == 0
    assert result["proposed"]["reorders"]["fair_share"] == 1  # b's went before a's third


def test_waits_are_grouped_by_the_key_the_requests_came_with(config):
    row(1, "alpha", 0, 0, sent=2, decided=0, ran=10, swap=True, key="a")
    row(2, "alpha", 0, 1, sent=12, decided=12, ran=2, swap=False, key="a")
    row(3, "alpha", 0, 3, sent=14, decided=14, ran=2, swap=False, key="b")
    row(4, "alpha", 0, 4, sent=16, decided=16, ran=2, swap=False)  # a config file key's, or an open server's
    result = replay(config)
    by_key = result["in_force"]["waits_by_key"]
    assert list(by_key) == ["", "a", "b"] and [by_key[k]["count"] for k in by_key] == [1, 2, 1]
    assert by_key["b"]["max"] == 11.0 and by_key["a"]["max"] == 11.0 and by_key[""]["max"] == 12.0

    def text(*args):
        out = io.StringIO()
        call_command("replay", "--config", config, "--since", T.isoformat(), "--by", "key", *args, stdout=out)
        return out.getvalue()

    compared = text("--set", "agingDivisor=10")
    assert "(no row key) wait p50/p95/max s" in compared and "a wait p50/p95/max s" in compared
    assert "interactive wait" not in compared
    swept = text("--sweep", "agingDivisor=10,60")
    assert "(no row key) p50/p95/max s" in swept and "b p50/p95/max s" in swept and "batch p50" not in swept


def test_a_sweep_has_one_run_per_value(config, recorded):
    result = replay(config, "--sweep", "swapAffinityBonus=0,5,50")
    assert [run["value"] for run in result["sweep"]["runs"]] == [0, 5, 50]
    assert result["sweep"]["key"] == "swapAffinityBonus"


def test_the_text_report_puts_both_runs_side_by_side(config, recorded):
    out = io.StringIO()
    call_command("replay", "--config", config, "--since", T.isoformat(), "--set", "agingDivisor=10", stdout=out)
    text = out.getvalue()
    assert "100.0% of 2 pairs that waited together sent in the same order" in text
    assert "agingDivisor=30 swapAffinityBonus=5" in text and "agingDivisor=10 swapAffinityBonus=5" in text
    assert "In force: 1 client left while waiting" in text and "1 refused for a failed start" in text


@pytest.mark.parametrize(("assignment", "message"), [
    ("agingDivisor=-5", "--set agingDivisor=-5: -5 is negative — use 0 to disable aging"),
    ("swapAffinityBonus=abc", "--set swapAffinityBonus=abc: 'abc' is not a number"),
    ("slots.nope=2", "--set slots.nope=2: 'nope' is not a configured model — use one of alpha, beta"),
    ("aging=5", "--set aging=5: no setting 'aging' — use agingDivisor=N, swapAffinityBonus=N, slots.MODEL=N or "
                "fairness=keys|off"),
    ("fairness=on", "--set fairness=on: 'on' is not a fairness mode — use keys"),
    ("slots.alpha=1025", "--set slots.alpha=1025: alpha: 1025 is above the maximum of 1024"),
    (f"slots.alpha={2**70}", f"--set slots.alpha={2**70}: alpha: {2**70} is above the maximum of 1024"),
])
def test_a_bad_setting_is_refused_in_one_line_naming_it_and_the_fix(config, assignment, message):
    err = io.StringIO()
    with pytest.raises(SystemExit) as exit_:
        call_command("replay", "--config", config, "--set", assignment, stderr=err)
    assert exit_.value.code == 2
    assert err.getvalue().startswith(message) and err.getvalue().count("\n") == 1


def test_what_if_gives_the_admin_the_same_comparison(config, recorded):
    from proxy.config import load_config
    from scheduling.core import SerialSettings
    from scheduling.operating.replay_history import what_if

    result = what_if(T, T + timedelta(hours=1), SerialSettings(aging_divisor=5, swap_affinity_bonus=0),
                     load_config(config))
    assert result.fidelity.same_order == 1.0
    assert result.window.warm == ["gone"]  # its first request needed no start; no longer configured, not warmed
    assert (result.before.settings.aging_divisor, result.after.settings.aging_divisor) == (30, 5)
    assert result.after.requests[2].wait_s == 11.0


def test_peer_requests_and_operator_cancels_are_counted_as_what_they_were(config):
    row(1, "alpha", 0, 0, sent=0, decided=0, ran=10, swap=False)
    row(2, "alpha", 0, 1, state="cancelled", ended=3, error="cancelled by an operator while queued")
    row(3, "alpha", 0, 2, state="cancelled", ended=4, error="client disconnected while queued")
    QueuedRequest.objects.create(id=4, model="box/llama", peer="box", path="/v1/chat/completions", route="chat",
                                 priority=0, state="completed", arrived_at=T + timedelta(seconds=5),
                                 finished_at=T + timedelta(seconds=6))
    played = replay(config)
    handling = played["in_force"]["handling"]
    assert (handling["left"], handling["cancelled"], handling["unconfigured"]) == (1, 1, 0)
    assert played["window"]["peer_requests"] == 1 and played["window"]["requests"] == 3
    out = io.StringIO()
    call_command("replay", "--config", config, "--since", T.isoformat(), stdout=out)
    text = out.getvalue()
    assert "0 of models no longer configured, 1 relayed to peers" in text
    assert "In force: 1 client left while waiting, 1 cancelled by an operator" in text


def placed_config(tmp_path, name: str, gpus: int) -> str:
    """alpha and beta, 16 GiB each, placed by memory on `gpus` GPUs of 24 GiB."""
    path = tmp_path / name
    gpu_list = ", ".join(f"{{id: {n}, memory: 24GiB}}" for n in range(gpus))
    path.write_text(textwrap.dedent(f"""
        hardware:
          gpus: [{gpu_list}]
        models:
          alpha:
            cmd: /bin/true --port ${{PORT}}
            memory: 16GiB
          beta:
            cmd: /bin/true --port ${{PORT}}
            memory: 16GiB
    """))
    return str(path)


@pytest.fixture
def alternating():
    """alpha and beta asked for in turn on one GPU, each start stopping the other: 4 s loads, 1 s jobs."""
    for n in range(6):
        model, arrived = ("alpha", "beta")[n % 2], 10 * n
        row(n + 1, model, 100, arrived, sent=arrived + 4, decided=arrived, ran=1, swap=True)


def test_another_config_with_a_second_gpu_is_tried_beside_the_one_in_force(tmp_path, alternating):
    one, two = placed_config(tmp_path, "one.yaml", 1), placed_config(tmp_path, "two.yaml", 2)
    result = replay(one, "--try-config", two)
    in_force, proposed = result["in_force"], result["proposed"]
    assert (in_force["config"], proposed["config"]) == (one, two)
    assert (in_force["swaps"], in_force["evicted_for_memory"], in_force["loading_gpu_s"]) == (6, 5, 24.0)
    assert (proposed["swaps"], proposed["evicted_for_memory"], proposed["loading_gpu_s"]) == (2, 0, 8.0)
    assert in_force["waits"]["interactive"]["p50"] == 4.0 and proposed["waits"]["interactive"]["p50"] == 0.0
    assert result["fidelity"]["wait_error_s"] == 0.0  # the one in force places as the recording did

    out = io.StringIO()
    call_command("replay", "--config", one, "--since", T.isoformat(), "--try-config", two, stdout=out)
    text = out.getvalue()
    assert one in text and two in text
    assert "hardware" in text and "GPU 0 24 GiB, GPU 1 24 GiB" in text
    assert "GPU-seconds loading models" in text and "models stopped for memory" in text


def test_a_tried_config_without_hardware_is_one_model_at_a_time_as_llama_swap_runs(tmp_path, config, alternating):
    two = placed_config(tmp_path, "two.yaml", 2)
    result = replay(two, "--try-config", config)
    assert result["in_force"]["swaps"] == 2 and result["proposed"]["swaps"] == 6


def test_a_sweep_runs_with_the_tried_config(tmp_path, alternating):
    one, two = placed_config(tmp_path, "one.yaml", 1), placed_config(tmp_path, "two.yaml", 2)
    result = replay(one, "--try-config", two, "--sweep", "agingDivisor=30,60")
    assert result["sweep"]["config"] == two and [run["swaps"] for run in result["sweep"]["runs"]] == [2, 2]


@pytest.mark.parametrize(("text", "message"), [
    (None, "--try-config {path}: no such file"),
    ("models: [oops", "--try-config {path}: the file does not load as a config:\n{path}"),
    ("models:\n  alpha:\n    cmd: x --port ${PORT}\n    memory: 16GiB\n",
     "--try-config {path}: the file does not load as a config:\n{path}: models.alpha.memory"),
])
def test_a_tried_config_that_does_not_load_is_refused_naming_the_file(tmp_path, config, text, message):
    path = tmp_path / "other.yaml"
    if text is not None:
        path.write_text(text)
    err = io.StringIO()
    with pytest.raises(SystemExit) as exit_:
        call_command("replay", "--config", config, "--try-config", str(path), stderr=err)
    assert exit_.value.code == 2
    assert err.getvalue().startswith(message.format(path=path))


def test_requests_for_models_the_tried_config_lacks_are_left_out_of_its_run_and_counted(tmp_path, config, alternating):
    alone = tmp_path / "alpha-only.yaml"
    alone.write_text("models:\n  alpha:\n    cmd: /bin/true --port ${PORT}\n")
    result = replay(config, "--try-config", str(alone))
    assert result["in_force"]["handling"]["unconfigured"] == 0 and result["proposed"]["handling"]["unconfigured"] == 3
    out = io.StringIO()
    call_command("replay", "--config", config, "--since", T.isoformat(), "--try-config", str(alone), stdout=out)
    assert "Proposed: 3 of models its config does not have, left out" in out.getvalue()


@pytest.mark.parametrize(("path", "message"), [
    ("/dev/null", "--try-config /dev/null: the file does not load as a config:\n/dev/null"),
    ("{tmp}", "--try-config {tmp}: a directory, not a file"),
])
def test_a_tried_config_that_is_no_regular_file_is_refused_saying_what_it_is(tmp_path, config, path, message):
    path = path.format(tmp=tmp_path)
    err = io.StringIO()
    with pytest.raises(SystemExit) as exit_:
        call_command("replay", "--config", config, "--try-config", path, stderr=err)
    assert exit_.value.code == 2
    assert err.getvalue().startswith(message.format(tmp=tmp_path)), err.getvalue()
