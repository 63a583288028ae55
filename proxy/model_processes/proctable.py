"""The kernel's process table as /proc shows it: who is in a process group, who started when, who listens where.

Model processes are identified after the fact (a restart after a crash, a health check answered by
someone) by facts the kernel keeps, not by command lines, which interpreters and wrappers change.
Every reader returns None where there is no /proc (not Linux) or the process is not ours to read,
so callers decide what an unknown means.
"""

from __future__ import annotations

import os

PROC = "/proc"


def available() -> bool:
    return os.path.isdir(f"{PROC}/self")


def _stat_fields(pid: int) -> list[bytes] | None:
    """Fields 3 onwards of /proc/<pid>/stat (state, ppid, pgrp, …); None when the process is gone."""
    try:
        with open(f"{PROC}/{pid}/stat", "rb") as stat_file:
            stat = stat_file.read()
    except OSError:
        return None
    # Format: pid (comm) state ppid pgrp ...; comm may itself contain spaces and parentheses.
    return stat[stat.rindex(b")") + 2 :].split()


def start_ticks(pid: int) -> int | None:
    """When a running (non-zombie) process started, in clock ticks since boot (stat field 22).

    Together with the pid it names one process for the whole uptime: a reused pid starts later.
    """
    fields = _stat_fields(pid)
    if fields is None or fields[0] == b"Z":
        return None
    return int(fields[22 - 3])


def boot_time() -> float | None:
    """When the machine booted (seconds since the epoch): start ticks count from here."""
    try:
        with open(f"{PROC}/stat", "rb") as stat_file:
            for line in stat_file:
                if line.startswith(b"btime "):
                    return float(line.split()[1])
    except OSError:
        pass
    return None


# The kernel's per-task flag set when a process begins to exit (stat field 9), before it closes its
# sockets: a client sees its connections reset while the process is not yet a zombie.
_PF_EXITING = 0x4


def running(pid: int) -> bool | None:
    """Whether `pid` is a live process: there, not a zombie, not exiting; None where there is no /proc."""
    if not available():
        return None
    fields = _stat_fields(pid)
    return fields is not None and fields[0] != b"Z" and not int(fields[9 - 3]) & _PF_EXITING


def group_members(pgid: int, *, exiting: bool = True) -> list[int] | None:
    """Pids of the group's non-zombie processes (without those already exiting, unless `exiting`);
    None where there is no /proc."""
    try:
        entries = os.listdir(PROC)
    except OSError:
        return None
    members = []
    for entry in entries:
        if not entry.isdigit():
            continue
        fields = _stat_fields(int(entry))
        if fields is None or fields[0] == b"Z" or int(fields[2]) != pgid:
            continue
        if exiting or not int(fields[9 - 3]) & _PF_EXITING:
            members.append(int(entry))
    return sorted(members)


def family(pid: int) -> set[int] | None:
    """`pid`, what it started and they started (by parent), and the rest of the process group it leads (a
    child that daemonized left its parent but kept its group): everything a model started as, say,
    `sh -c 'exec server'` or a wrapper script runs as. None where there is no /proc."""
    try:
        entries = os.listdir(PROC)
    except OSError:
        return None
    children: dict[int, list[int]] = {}
    found = {pid}
    for entry in entries:
        if entry.isdigit() and (fields := _stat_fields(int(entry))) is not None and fields[0] != b"Z":
            children.setdefault(int(fields[1]), []).append(int(entry))
            if int(fields[2]) == pid:
                found.add(int(entry))
    unseen = list(found)
    while unseen:
        for child in children.get(unseen.pop(), ()):
            if child not in found:
                found.add(child)
                unseen.append(child)
    return found


def group_of(pid: int) -> int | None:
    """The process group of `pid` (stat field 5); None when the process is gone."""
    fields = _stat_fields(pid)
    return None if fields is None else int(fields[2])


def _environment(pid: int) -> list[bytes] | None:
    """The `NAME=value` entries the process started with; None if unreadable (gone, or not ours)."""
    try:
        with open(f"{PROC}/{pid}/environ", "rb") as environ_file:
            return environ_file.read().split(b"\0")
    except OSError:
        return None


def has_environment_entry(pid: int, entry: str) -> bool | None:
    """Whether `NAME=value` is in the environment the process started with; None if unreadable."""
    environ = _environment(pid)
    return None if environ is None else os.fsencode(entry) in environ


def environment_values(name: str) -> dict[int, str] | None:
    """pid -> the value of `name` in the environment of every process that has it and that we may read;
    None where there is no /proc."""
    try:
        entries = os.listdir(PROC)
    except OSError:
        return None
    prefix = os.fsencode(f"{name}=")
    found = {}
    for entry in entries:
        if entry.isdigit():
            for item in _environment(int(entry)) or ():
                if item.startswith(prefix):
                    found[int(entry)] = os.fsdecode(item[len(prefix):])
                    break
    return found


def group_listens_on(pgid: int, port: int) -> bool | None:
    """Whether a process of the group holds a TCP listening socket on `port` (any address).

    Matches the inodes of listening sockets in /proc/net/tcp{,6} with the group's open file
    descriptors; None where there is no /proc.
    """
    listening = _listening_inodes(port)
    members = group_members(pgid)
    if listening is None or members is None:
        return None
    sockets = {f"socket:[{inode}]" for inode in listening}
    for pid in members:
        try:
            descriptors = os.listdir(f"{PROC}/{pid}/fd")
        except OSError:
            continue
        for descriptor in descriptors:
            try:
                if os.readlink(f"{PROC}/{pid}/fd/{descriptor}") in sockets:
                    return True
            except OSError:
                continue
    return False


def _listening_inodes(port: int) -> set[str] | None:
    """Inodes of the TCP sockets listening on `port`, from /proc/net/tcp and /proc/net/tcp6."""
    inodes: set[str] = set()
    found_any_table = False
    for table in ("tcp", "tcp6"):
        try:
            with open(f"{PROC}/net/{table}") as table_file:
                lines = table_file.readlines()[1:]
        except OSError:
            continue
        found_any_table = True
        for line in lines:
            # sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode ...
            fields = line.split()
            local_port = int(fields[1].rsplit(":", 1)[1], 16)
            if local_port == port and fields[3] == "0A":  # 0A: TCP_LISTEN
                inodes.add(fields[9])
    return inodes if found_any_table else None
