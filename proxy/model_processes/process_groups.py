"""A model's process group as a whole: is any of it alive, signal it, stop it, and say how a process ended.

A model server is started in a group of its own, so a wrapper script's children are stopped with it.
"""

from __future__ import annotations

import logging
import os
import signal
import time

from proxy.model_processes import proctable

logger = logging.getLogger("llamaswap.processes")

GROUP_POLL_INTERVAL_S = 0.02
# SIGKILL cannot be ignored, but a process in uninterruptible sleep (e.g. a GPU driver call) takes a moment.
KILL_GRACE_S = 5.0


def describe_exit(returncode: int) -> str:
    """'exited with status 3' or 'was killed by SIGKILL' (asyncio reports signals as negative codes)."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"was killed by {name}"
    return f"exited with status {returncode}"


def process_group_alive(pgid: int, *, exiting: bool = True) -> bool:
    """Whether any process of the group still runs (zombies waiting to be reaped do not count, nor,
    unless `exiting`, processes already on their way out)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    members = proctable.group_members(pgid, exiting=exiting)
    return True if members is None else bool(members)


def kill_process_group(pgid: int, *, timeout: float = 5.0) -> bool:
    """SIGTERM a process group, SIGKILL it after `timeout`; returns whether it signalled anything.

    Blocking: for start-up recovery, before the event loop runs. The caller has made sure the
    group is the one it means (see `proxy.model_processes.orphans`).
    """
    if not signal_group(pgid, signal.SIGTERM):
        return False
    if not wait_group_gone_blocking(pgid, timeout):
        signal_group(pgid, signal.SIGKILL)
        if not wait_group_gone_blocking(pgid, KILL_GRACE_S):
            logger.error("process group %d survived SIGKILL", pgid)
    return True


def signal_group(pgid: int, sig: signal.Signals) -> bool:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:
        logger.error("not allowed to signal process group %d", pgid)
        return False
    return True


def wait_group_gone_blocking(pgid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while process_group_alive(pgid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(GROUP_POLL_INTERVAL_S)
    return True
