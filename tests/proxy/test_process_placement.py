"""The GPUs placement gives a model reach its process: CUDA_VISIBLE_DEVICES and ${GPUS} in its cmd (and cmdStop),
set anew at each start; a start without them leaves the service's environment and the cmd as they are.

Real fake model servers, which report the CUDA_VISIBLE_DEVICES they were started with."""

from __future__ import annotations

import json
import shlex
import sys
import textwrap

from proxy.config import parse_config
from proxy.model_processes.fleet import ProcessFleet
from tests.proxy.test_model_process import REPO_ROOT, fakemodel_config, harness, http_client  # noqa: F401 (fixture)
from tests.served import model_ports


async def health(proxy: str) -> dict:
    async with http_client() as client:
        answer = await client.get(proxy + "/health")
    assert answer.status_code == 200
    return answer.json()


async def served_by(proxy: str) -> str:
    async with http_client() as client:
        return (await client.post(proxy + "/v1/rerank", json={})).json()["served_by"]


async def test_each_start_gets_its_gpus_in_cuda_visible_devices_and_in_the_cmd(harness, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7")  # the service's own: placement's replaces it
    config = fakemodel_config("--model", "on-${GPUS}")
    model = harness.process(config)

    await model.start(gpus=("0", "GPU-5b1e"))
    assert await health(config.proxy) == {"status": "ok", "cuda_visible_devices": "0,GPU-5b1e"}
    assert await served_by(config.proxy) == "on-0,GPU-5b1e"
    assert model.gpus == ("0", "GPU-5b1e")
    assert harness.spawned[-1][0].cmdline[-1] == "on-0,GPU-5b1e", "the recorded command line is the one that ran"

    await model.stop()
    assert model.gpus is None
    await model.start(gpus=())  # a CPU-only model sees no GPU at all
    assert await health(config.proxy) == {"status": "ok", "cuda_visible_devices": ""}
    assert await served_by(config.proxy) == "on-"


async def test_a_start_without_gpus_changes_nothing(harness, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7")
    config = fakemodel_config("--model", "on-${GPUS}")
    model = harness.process(config)

    await model.start()
    assert await health(config.proxy) == {"status": "ok", "cuda_visible_devices": "7"}
    assert await served_by(config.proxy) == "on-${GPUS}"
    assert model.gpus is None


async def test_cmd_stop_gets_the_gpus_the_process_was_started_on(harness, tmp_path):
    seen = tmp_path / "stop-command-saw"
    stop_script = (
        "import json, os, signal, sys;"
        "open(sys.argv[3], 'w').write(json.dumps([sys.argv[2], os.environ.get('CUDA_VISIBLE_DEVICES')]));"
        "os.kill(int(sys.argv[1]), signal.SIGTERM)"
    )
    config = fakemodel_config(cmd_stop=(sys.executable, "-c", stop_script, "${PID}", "--devices=${GPUS}", str(seen)))
    model = harness.process(config)
    await model.start(gpus=("1", "3"))

    await model.stop()
    assert json.loads(seen.read_text()) == ["--devices=1,3", "1,3"]
    assert model.state == "stopped"


class Recorder:
    def __init__(self):
        self.started: list[tuple] = []

    def process_started(self, model, pid, pgid, cmdline, **where) -> None:
        self.started.append((model, cmdline))

    def process_stopped(self, marker) -> None:
        pass


async def test_the_fleet_starts_a_configured_model_on_the_gpus_it_is_given():
    port = model_ports(1)
    command = shlex.join([sys.executable, "-m", "fakemodel", "--port", str(port), "--model", "on-${GPUS}"])
    config = parse_config(textwrap.dedent(f"""\
        hardware:
          gpus: [{{id: 0, memory: 24GiB}}, {{id: 1, memory: 24GiB}}]
        models:
          m:
            cmd: {command}
            proxy: http://127.0.0.1:{port}
            env: ["PYTHONPATH={REPO_ROOT}"]
            memory: 20GiB
            gpus: 2
    """))
    recorder = Recorder()
    fleet = ProcessFleet(config, recorder, on_crash=lambda model: None)
    try:
        await fleet.swap_in("m", (), gpus=("0", "1"))
        assert (await health(f"http://127.0.0.1:{port}"))["cuda_visible_devices"] == "0,1"
        assert recorder.started == [("m", [*shlex.split(command)[:-1], "on-0,1"])]
    finally:
        await fleet.stop_all()
    assert fleet.state("m") == "stopped"
