"""Model processes a previous run left running when it ended abruptly (SIGKILL, a crash).

Every model process group is recorded when it is spawned and the record is removed once the group
is stopped, so the records found at start-up are groups that may still hold GPU memory and their
ports. A recorded group is stopped only when it provably still is the one recorded: its leader
has the recorded start time (a pid reused since starts later), or — the leader gone, a forked
child surviving — a member carries the group's marker in its environment. Anything else is left
alone, with the reason logged.
"""

from __future__ import annotations

import logging

from proxy import proctable
from proxy.processes import PROCESS_MARKER_VARIABLE, kill_process_group

log = logging.getLogger("llamaswap.recovery")

ORPHAN_STOP_TIMEOUT_S = 5.0


def stop_orphaned_model_processes(models: list[str] | None = None) -> None:
    """Stop the recorded model process groups that still run, then forget their records. A worker in
    distributed mode passes its `models`: the others' processes belong to workers on other boxes."""
    from scheduling.models import ModelProcessRecord

    records = ModelProcessRecord.objects.all() if models is None else ModelProcessRecord.objects.filter(model__in=models)
    for record in records:
        ours, reason = identify(record)
        if ours is None:
            log.info("process group %d of model %s, left by a previous run, is already gone", record.pgid, record.model)
        elif not ours:
            log.warning(
                "not stopping process group %d recorded for model %s by a previous run: %s",
                record.pgid, record.model, reason,
            )
        elif kill_process_group(record.pgid, timeout=ORPHAN_STOP_TIMEOUT_S):
            log.warning(
                "stopped process group %d of model %s, left running by a previous run: %s",
                record.pgid, record.model, reason,
            )
        else:
            log.warning(
                "could not stop process group %d of model %s, left by a previous run: it ended first, "
                "or it belongs to another user", record.pgid, record.model,
            )
    records.delete()


def identify(record) -> tuple[bool | None, str]:
    """Whether the recorded group still runs as recorded (None: nothing of it runs), and why."""
    if not proctable.available():
        return False, (
            "without /proc its processes cannot be told from others that reused its ids; "
            f"if it is still the model, stop it with `kill -TERM -{record.pgid}`"
        )
    boot = proctable.boot_time()
    if boot is not None and record.started_at.timestamp() < boot:
        return False, "it was recorded before the machine last booted, so no process of it can still run"
    leader_ticks = proctable.start_ticks(record.pgid)
    if leader_ticks is not None:
        if record.start_ticks is None:
            return False, f"no start time was recorded, so pid {record.pgid} cannot be told from a process that reused it"
        if leader_ticks != record.start_ticks:
            return False, (
                f"pid {record.pgid} is now another process (started at tick {leader_ticks}, "
                f"the model's at tick {record.start_ticks})"
            )
        return True, f"its leader, pid {record.pgid}, still runs with the recorded start time"
    members = proctable.group_members(record.pgid) or []
    if not members:
        return None, "nothing of it runs"
    if not record.marker:
        return False, f"its leader is gone and no marker was recorded to recognise the rest of it ({members})"
    entry = f"{PROCESS_MARKER_VARIABLE}={record.marker}"
    carriers = [pid for pid in members if proctable.has_environment_entry(pid, entry)]
    if not carriers:
        return False, f"its leader is gone and none of the group's processes {members} carries its marker"
    return True, f"its leader is gone, but processes {carriers} of the group carry its marker"
