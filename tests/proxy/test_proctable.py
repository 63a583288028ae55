"""Who counts as a member of a model's process group, read from a /proc laid out by the test.

A process SIGKILLed with much memory stays in state R for a while with the kernel's PF_EXITING
flag set, and it resets its sockets before it becomes a zombie: the crash check must count it gone.
"""

from __future__ import annotations

import pytest

from proxy.model_processes import proctable

GROUP = 4000


def stat_line(pid: int, state: str, pgrp: int, flags: int, comm: str = "llama-server (x)") -> str:
    # pid (comm) state ppid pgrp session tty_nr tpgid flags ...: the 22nd field is the start time.
    fields = [state, "1", str(pgrp), str(pgrp), "0", "-1", str(flags)] + ["0"] * 12 + ["12345"] + ["0"] * 30
    return f"{pid} ({comm}) " + " ".join(fields) + "\n"


@pytest.fixture
def proc(tmp_path, monkeypatch):
    def lay_out(*processes: tuple[int, str, int, int]) -> None:
        for pid, state, pgrp, flags in processes:
            (tmp_path / str(pid)).mkdir()
            (tmp_path / str(pid) / "stat").write_text(stat_line(pid, state, pgrp, flags))

    monkeypatch.setattr(proctable, "PROC", str(tmp_path))
    return lay_out


def test_a_process_already_exiting_is_a_member_only_when_asked_for(proc):
    running, exiting, zombie, other_group = 4000, 4001, 4002, 4003
    proc((running, "S", GROUP, 0x400100), (exiting, "R", GROUP, 0x40040C), (zombie, "Z", GROUP, 0x40840C),
         (other_group, "S", GROUP + 1, 0x400100))
    assert proctable.group_members(GROUP) == [running, exiting]
    assert proctable.group_members(GROUP, exiting=False) == [running]


def test_a_group_whose_last_process_is_exiting_has_no_member_left(proc):
    proc((GROUP, "R", GROUP, 0x40040C))
    assert proctable.group_members(GROUP) == [GROUP], "it still runs: a stop waits for it"
    assert proctable.group_members(GROUP, exiting=False) == [], "its connections may already be reset: it is gone"
    assert proctable.start_ticks(GROUP) == 12345
