"""Model servers that do not stop when asked: the service kills their whole group and keeps serving.

A stray model server keeps its GPU memory, so the next model cannot load; whatever the stop
command does and whatever the server ignores, nothing of the old group may survive a swap or a
shutdown.
"""

from __future__ import annotations

import shlex
import signal
import sys

import httpx
import pytest

from proxy.model_processes.process_groups import process_group_alive
from tests.reliability.support import all_rows_terminal, chat, group_members, model_pgid, serial_config
from tests.served import Served, fake_cmd

pytestmark = pytest.mark.e2e

UNLOAD_TIMEOUT_S = 1


def shell_wrapper(*fakemodel_args: str) -> str:
    """`cmd:` of a launcher script: sh forks the model server as a grandchild of llamaswap and waits."""
    server = [sys.executable, "-m", "fakemodel", "--model", "stubborn", *fakemodel_args]
    return shlex.join(["/bin/sh", "-c", '"$@" --port ${PORT} & wait', "sh", *server])


STUBBORN = {
    # cmdStop runs but does nothing useful: the server never hears about the stop.
    "cmdStop fails": ({"cmd": fake_cmd("stubborn"), "cmdStop": "/bin/false"}, 1, "killing process group"),
    "ignores SIGTERM": ({"cmd": fake_cmd("stubborn", None, "--ignore-sigterm")}, 1, "ignoring SIGTERM"),
    # SIGTERM to the group reaches sh and its child alike.
    "shell wrapper": ({"cmd": shell_wrapper()}, 2, None),
    # sh dies on SIGTERM, its child ignores it and is orphaned, still in the group.
    "shell wrapper, child ignores SIGTERM": ({"cmd": shell_wrapper("--ignore-sigterm")}, 2, "ignoring SIGTERM"),
}


@pytest.mark.parametrize("case", list(STUBBORN))
def test_a_model_that_will_not_stop_is_killed_with_its_group_on_swap_and_on_shutdown(tmp_path, case):
    stubborn, processes, evidence = STUBBORN[case]
    text = serial_config(
        {"stubborn": {**stubborn, "unloadTimeout": UNLOAD_TIMEOUT_S}, "other": {"cmd": fake_cmd("other")}}
    )
    served = Served(tmp_path, text).start()
    try:
        loaded = chat(served.base, "stubborn")
        assert loaded.status_code == 200, loaded.text
        first = model_pgid(served.data_dir, "stubborn")
        members = group_members(first)
        assert len(members) == processes, f"expected {processes} processes in the model's group, found {members}"

        swapped = chat(served.base, "other")  # the swap has to stop `stubborn` first
        assert swapped.status_code == 200, swapped.text
        assert not process_group_alive(first), f"processes {group_members(first)} of the old model survived the swap"
        if evidence:
            assert evidence in served.log() + httpx.get(served.base + "/logs").text

        reloaded = chat(served.base, "stubborn")  # and it starts again afterwards
        assert reloaded.status_code == 200, reloaded.text
        second = model_pgid(served.data_dir, "stubborn", previous=first)
    finally:
        exit_status = served.stop(signal.SIGTERM)
    assert exit_status == 0
    assert not process_group_alive(second), f"processes {group_members(second)} outlived the service"
    assert {r["state"] for r in all_rows_terminal(served.data_dir, 3)} == {"completed"}
