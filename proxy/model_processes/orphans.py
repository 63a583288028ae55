"""Model processes a previous run left running when it ended abruptly (SIGKILL, a crash).

Every model process group is recorded when it is spawned and the record is removed once the group
is stopped, so the records found at start-up are groups that may still hold GPU memory and their
ports. A recorded group is stopped only when it provably still is the one recorded: its leader
has the recorded start time (a pid reused since starts later), or — the leader gone, a forked
child surviving — a member carries the group's marker in its environment. Anything else is left
alone, with the reason logged.

Records are written behind, so a run killed while its database was away leaves groups it never
recorded. Every group therefore also carries its owner in its environment: the data it served (the
database's identity, not the address it was reached at, which differs between a worker and its
standby), the owner's pid and start time, and the model. A group of this data whose owner no
longer runs is stopped too; a live service's groups, or another database's, are never touched.
"""

from __future__ import annotations

import hashlib
import logging
import os

from proxy.model_processes import proctable
from proxy.model_processes.child_environment import PROCESS_MARKER_VARIABLE, PROCESS_OWNER_VARIABLE
from proxy.model_processes.process_groups import kill_process_group

log = logging.getLogger("llamaswap.recovery")

ORPHAN_STOP_TIMEOUT_S = 5.0

_owner: str | None = None  # this process's "<data> <pid> <start ticks>", once it has recovered


def process_owner() -> str | None:
    """What identifies this service as the owner of the model processes it starts (`PROCESS_OWNER_VARIABLE`);
    None in a process that never ran start-up recovery (it owns no data)."""
    return _owner


def stop_orphaned_model_processes(models: list[str] | None = None) -> None:
    """Stop the model process groups a previous run left running, recorded or not, then forget their
    records. A worker in distributed mode passes its `models`: the others' processes belong to workers
    on other boxes (or on this one, alive)."""
    global _owner
    data = _data_identity()
    _owner = f"{data} {os.getpid()} {proctable.start_ticks(os.getpid())}"
    _stop_recorded(models)
    _stop_unrecorded(data, models)


def _stop_recorded(models: list[str] | None) -> None:
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


def _stop_unrecorded(data: str, models: list[str] | None) -> None:
    """Stop the groups of `data`'s models whose owner is gone, as their environment says."""
    groups: dict[int, tuple[str, str]] = {}  # group -> (model, owner pid)
    for pid, value in (proctable.environment_values(PROCESS_OWNER_VARIABLE) or {}).items():
        parts = value.split(" ", 3)
        if len(parts) != 4 or parts[0] != data or (models is not None and parts[3] not in models):
            continue
        if _owner_runs(parts[1], parts[2]):
            continue
        group = proctable.group_of(pid)
        if group is not None:
            groups.setdefault(group, (parts[3], parts[1]))
    for group, (model, owner) in groups.items():
        if kill_process_group(group, timeout=ORPHAN_STOP_TIMEOUT_S):
            log.warning(
                "stopped process group %d of model %s, left running by a previous run (pid %s, gone) "
                "before it could record it", group, model, owner,
            )


def _owner_runs(pid: str, ticks: str) -> bool:
    """Whether the service that started a group still runs (a pid reused since starts later)."""
    if not pid.isdigit():
        return True  # not written by us: leave it alone
    return bool(proctable.running(int(pid))) and ticks in ("None", str(proctable.start_ticks(int(pid))))


def _data_identity() -> str:
    """A short name of the database this service owns, the same however it is reached: PostgreSQL's
    system identifier and database name, or the SQLite file's real path."""
    from django.db import DatabaseError, connection

    database = connection.settings_dict
    if connection.vendor == "postgresql":
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT system_identifier::text, current_database() FROM pg_control_system()")
                identity = "postgresql {} {}".format(*cursor.fetchone())
        except DatabaseError:  # not allowed to read it: the address must do
            identity = f"postgresql {database.get('HOST')}:{database.get('PORT')}/{database['NAME']}"
    else:
        identity = f"{connection.vendor} {os.path.realpath(database['NAME'])}"
    return hashlib.sha256(identity.encode()).hexdigest()[:16]
