"""Measuring what models use of GPU memory with nvidia-smi: its CSV read (garbage, N/A and all), a model's use
found by its process tree (a wrapper's children included), the GPU named as `hardware:` names it, and a
nvidia-smi that is missing, fails, hangs or talks nonsense costs nothing but the figure, said once."""

from __future__ import annotations

import asyncio
import os
import shlex
import stat
import subprocess
import sys
import textwrap
import time

import pytest
from hypothesis import given, strategies as st

from proxy.model_processes import gpu_memory, proctable
from proxy.model_processes.gpu_memory import (
    COMPUTE_APPS, GpuMemoryWatch, ask, nvidia_smi_command, parse_compute_apps, parse_gpu_indexes, use_of,
)
from proxy.config import parse_config
from proxy.model_processes.fleet import ProcessFleet
from fakemodel.nvidia_smi import answer
from fakemodel.server import GPU_DIR_VARIABLE
from tests.proxy.test_process_placement import Recorder
from tests.proxy.test_model_process import REPO_ROOT
from tests.served import model_ports, wait_until

# What `nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory --format=csv,noheader,nounits` prints.
COMPUTE_APPS_CSV = """\
4242, GPU-5b1e0c8a-aaaa-bbbb-cccc-000000000000, 3072
4242, GPU-77f0aa11-aaaa-bbbb-cccc-111111111111, 1024
4343, GPU-5b1e0c8a-aaaa-bbbb-cccc-000000000000, [N/A]
4444, GPU-5b1e0c8a-aaaa-bbbb-cccc-000000000000, [Not Supported]
[N/A], GPU-5b1e0c8a-aaaa-bbbb-cccc-000000000000, 100
4545, GPU-5b1e0c8a-aaaa-bbbb-cccc-000000000000, 512
"""
GPU_INDEXES_CSV = "0, GPU-5b1e0c8a-aaaa-bbbb-cccc-000000000000\n1, GPU-77f0aa11-aaaa-bbbb-cccc-111111111111\n"
FIRST, SECOND = "GPU-5b1e0c8a-aaaa-bbbb-cccc-000000000000", "GPU-77f0aa11-aaaa-bbbb-cccc-111111111111"


def test_compute_apps_give_each_process_its_mib_by_gpu_and_leave_out_what_is_not_a_figure():
    assert parse_compute_apps(COMPUTE_APPS_CSV) == {4242: {FIRST: 3072, SECOND: 1024}, 4545: {FIRST: 512}}


@pytest.mark.parametrize("text", ["", "No running processes found\n", "garbage\n\x00\xff, ,\n", "1,2\n", "a, b, c\n",
                                  "12, GPU-x, 3072 MiB\n", "12, , 30\n", "², GPU-x, 3\n", "1, GPU-x, ³\n"])
def test_output_that_is_no_compute_app_row_is_nothing(text):
    assert parse_compute_apps(text) == {}


@given(st.text(alphabet=st.sampled_from("0123456789²³, \n[]/NAGPU-x\x00")) | st.text())
def test_no_output_breaks_the_readers_and_what_they_keep_is_figures(text):
    for uses in parse_compute_apps(text).values():
        assert uses and all(isinstance(mib, int) and mib >= 0 for mib in uses.values())
    assert all(index.isascii() and index.isdigit() for index in parse_gpu_indexes(text).values())


def test_gpu_indexes_by_uuid_and_nonsense_left_out():
    assert parse_gpu_indexes(GPU_INDEXES_CSV + "[N/A], GPU-x\nNo devices were found\n") == {FIRST: "0", SECOND: "1"}


def test_a_models_use_sums_its_processes_and_names_each_gpu_as_hardware_does():
    apps = parse_compute_apps(COMPUTE_APPS_CSV)
    indexes = parse_gpu_indexes(GPU_INDEXES_CSV)
    assert use_of({4242, 4545, 1}, apps, indexes, ["0", "1"]) == {"0": 3584, "1": 1024}
    assert use_of({4242}, apps, indexes, [FIRST, "1"]) == {FIRST: 3072, "1": 1024}  # by UUID where it is named so
    assert use_of({4242}, apps, {}, ["0"]) == {FIRST: 3072, SECOND: 1024}  # no index known: its UUID
    assert use_of({99}, apps, indexes, ["0"]) == {}


def test_the_setting_names_nvidia_smi_or_turns_measuring_off(tmp_path, monkeypatch):
    tool = executable(tmp_path / "smi", "exit 0\n")
    monkeypatch.setenv("PATH", str(tmp_path))
    assert nvidia_smi_command({}) is None  # none on PATH
    assert nvidia_smi_command({gpu_memory.COMMAND_SETTING: tool}) == tool
    assert nvidia_smi_command({gpu_memory.COMMAND_SETTING: ""}) is None
    executable(tmp_path / "nvidia-smi", "exit 0\n")
    assert nvidia_smi_command({}) == str(tmp_path / "nvidia-smi")
    assert nvidia_smi_command({gpu_memory.COMMAND_SETTING: ""}) is None


def executable(path, body: str) -> str:
    path.write_text("#!/bin/sh\n" + textwrap.dedent(body))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


@pytest.fixture
def wrapped_model(tmp_path):
    """A model started as `sh -c` that runs a fake server in the background (not exec'd): the server is the
    wrapper's child, and what uses the GPU. Yields (the wrapper's pid, the GPU-state directory)."""
    gpu_dir = tmp_path / "gpus"
    gpu_dir.mkdir()
    server = f"{sys.executable} -m fakemodel --port 0 --gpu-memory 3072"
    wrapper = subprocess.Popen(["sh", "-c", f"{server} >/dev/null 2>&1 & wait"], start_new_session=True,
                               env={**os.environ, GPU_DIR_VARIABLE: str(gpu_dir), "CUDA_VISIBLE_DEVICES": "1"})
    try:
        wait_until(lambda: list(gpu_dir.glob("*.json")), what="the fake server's GPU state")
        yield wrapper.pid, gpu_dir
    finally:
        os.killpg(wrapper.pid, 9)
        wrapper.wait()


def test_a_models_family_holds_what_its_wrapper_started(wrapped_model):
    pid, gpu_dir = wrapped_model
    server = int(next(gpu_dir.glob("*.json")).stem)
    assert server != pid and {pid, server} <= proctable.family(pid)
    assert os.getpid() not in proctable.family(pid)


def test_the_watch_measures_a_wrapped_model_through_the_fake_nvidia_smi(tmp_path, wrapped_model, monkeypatch):
    pid, gpu_dir = wrapped_model
    monkeypatch.setenv(GPU_DIR_VARIABLE, str(gpu_dir))
    tool = executable(tmp_path / "nvidia-smi", f'exec {sys.executable} -m fakemodel.nvidia_smi "$@"\n')
    watch = GpuMemoryWatch(tool, Fleet(gpus=("0", "1")), report=lambda *_: None)
    with subprocess.Popen(["sleep", "30"]) as other:  # a model of no GPU use: left out
        try:
            assert asyncio.run(watch.measure({"m": pid, "other": other.pid})) == {"m": {"1": 3072}}
        finally:
            other.kill()


def test_the_fake_nvidia_smi_leaves_out_a_server_that_has_exited(tmp_path):
    (tmp_path / "1.json").write_text('{"pid": 999999999, "cuda_visible_devices": "0", "mib": 10}')
    (tmp_path / "2.json").write_text(f'{{"pid": {os.getpid()}, "cuda_visible_devices": null, "mib": 20}}')
    (tmp_path / "3.json").write_text("{half written")
    environ = {GPU_DIR_VARIABLE: str(tmp_path)}
    assert answer(list(COMPUTE_APPS), environ) == f"{os.getpid()}, GPU-fake-0, 20\n"
    assert answer(["--query-gpu=index,memory.used,fan.speed", "--format=csv"], environ) == (
        "0, 20, [N/A]\n1, 0, [N/A]\n")


@pytest.mark.parametrize("body, why", [
    ("sleep 30\n", "did not answer within 0.5s"),
    ("echo 'NVIDIA-SMI has failed because it could not communicate with the driver' >&2\nexit 9\n",
     "exited with 9: NVIDIA-SMI has failed"),
])
def test_a_hanging_or_failing_nvidia_smi_is_said_once_and_measures_nothing(tmp_path, body, why, caplog):
    watch = GpuMemoryWatch(executable(tmp_path / "nvidia-smi", body), Fleet(), report=lambda *_: None, timeout=0.5)
    started = time.monotonic()
    with caplog.at_level("WARNING", logger="llamaswap.gpu_memory"):
        assert asyncio.run(watch.measure({"m": os.getpid()})) == {}
        assert asyncio.run(watch.measure({"m": os.getpid()})) == {}
    assert time.monotonic() - started < 5, "a hung nvidia-smi is killed with what it started"
    assert [why in record.getMessage() for record in caplog.records] == [True]


def test_garbage_or_a_missing_command_measures_nothing(tmp_path):
    garbage = executable(tmp_path / "nvidia-smi", "printf '\\377\\376 what, is, this\\n1, 2\\n'\n")
    assert asyncio.run(GpuMemoryWatch(garbage, Fleet(), report=print).measure({"m": os.getpid()})) == {}
    gone = GpuMemoryWatch(str(tmp_path / "not-there"), Fleet(), report=print)
    assert asyncio.run(gone.measure({"m": os.getpid()})) == {}
    with pytest.raises(OSError):
        asyncio.run(ask(str(tmp_path / "not-there"), COMPUTE_APPS))


def test_the_watch_measures_a_model_once_ready_then_again_only_after_its_period(tmp_path, monkeypatch):
    """Every run of nvidia-smi is counted: one when the model became ready, none while it stays within the period."""
    monkeypatch.setattr(gpu_memory, "CHECK_EVERY_S", 0.01)
    runs = tmp_path / "runs"
    tool = executable(tmp_path / "nvidia-smi", f"""\
        echo run >> {runs}
        case "$1" in --query-compute-apps*) echo "{os.getpid()}, GPU-a, 700";; *) echo "0, GPU-a";; esac
        """)
    fleet = Fleet(gpus=("0",))
    told = []

    async def scenario():
        watch = asyncio.create_task(GpuMemoryWatch(tool, fleet, report=lambda m, use: told.append((m, use)),
                                                   every=3600).run())
        await asyncio.sleep(0.1)
        assert told == [] and not runs.exists()  # nothing ready: nothing run
        fleet.ready = {"m": os.getpid()}
        while not told:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)
        watch.cancel()

    asyncio.run(scenario())
    assert told == [("m", {"0": 700})]
    assert runs.read_text().count("run") == 2  # the compute apps, then the GPUs' indexes: once


def test_a_loaded_model_is_measured_again_each_period(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_memory, "CHECK_EVERY_S", 0.01)
    tool = executable(tmp_path / "nvidia-smi", f'echo "{os.getpid()}, GPU-a, 700"\n')
    fleet = Fleet()
    fleet.ready = {"m": os.getpid()}
    told = []

    async def scenario():
        watch = asyncio.create_task(GpuMemoryWatch(tool, fleet, report=lambda m, use: told.append(use), every=0.05).run())
        while len(told) < 3:
            await asyncio.sleep(0.01)
        watch.cancel()

    asyncio.run(asyncio.wait_for(scenario(), 10))
    assert all(set(use) == {"GPU-a"} for use in told)  # the index query answered nothing: named by its UUID


def measured_fleet(tmp_path, tool: str, told: list, timeout: float = gpu_memory.ANSWER_TIMEOUT_S) -> ProcessFleet:
    """A real fleet of one model `m` on a GPU of 4 GiB, declaring 1 GiB and using 3 GiB (a fake server), measured
    at its starts as the service wires it, with the nvidia-smi `tool`."""
    port = model_ports(1)
    command = shlex.join([sys.executable, "-m", "fakemodel", "--port", str(port), "--gpu-memory", "3072"])
    config = parse_config(textwrap.dedent(f"""\
        hardware:
          gpus: [{{id: 0, memory: 4GiB}}]
        models:
          m:
            cmd: {command}
            proxy: http://127.0.0.1:{port}
            env: ["PYTHONPATH={REPO_ROOT}"]
            memory: 1GiB
    """))
    fleet = ProcessFleet(config, Recorder(), on_crash=lambda model: None)
    watch = GpuMemoryWatch(tool, fleet, report=lambda model, use: told.append((model, use)), timeout=timeout)
    fleet.measure_started = watch.measure_started
    return fleet


async def test_a_started_model_is_measured_before_it_counts_as_ready(tmp_path, monkeypatch):
    """The start returns (and the scheduler is told the model is ready) only once it has been measured: nothing is
    placed beside it on a declaration found short, even for the moment before the periodic measurement."""
    gpu_dir = tmp_path / "gpus"
    gpu_dir.mkdir()
    monkeypatch.setenv(GPU_DIR_VARIABLE, str(gpu_dir))
    tool = executable(tmp_path / "nvidia-smi", f'exec {sys.executable} -m fakemodel.nvidia_smi "$@"\n')
    told: list = []
    fleet = measured_fleet(tmp_path, tool, told)
    try:
        await fleet.swap_in("m", (), gpus=("0",))
        assert told == [("m", {"0": 3072})]
    finally:
        await fleet.stop_all()


async def test_a_hung_nvidia_smi_holds_up_one_start_by_its_deadline_and_then_none(tmp_path):
    runs = tmp_path / "runs"
    hung = executable(tmp_path / "nvidia-smi", f"echo run >> {runs}\nsleep 30\n")
    told: list = []
    fleet = measured_fleet(tmp_path, hung, told, timeout=0.5)
    try:
        for _ in range(2):
            await fleet.swap_in("m", (), gpus=("0",))
            assert fleet.state("m") == "ready"
            await fleet.stop("m")
    finally:
        await fleet.stop_all()
    assert told == [] and runs.read_text().count("run") == 1  # the second start did not ask it


class Fleet:
    """The part of `ProcessFleet` the watch reads."""

    def __init__(self, gpus: tuple[str, ...] = ("0",)):
        self.ready: dict[str, int] = {}
        self.config = type("Config", (), {"hardware": type("Hardware", (), {"gpus": dict.fromkeys(gpus, 24_576)})})

    def ready_pids(self) -> dict[str, int]:
        return dict(self.ready)
