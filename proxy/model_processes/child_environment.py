"""What a model server process is started with: the service's environment, the model's `env`, the markers
that find its group again after a crash, and a PATH on which `llamaswap` is the one serving it."""

from __future__ import annotations

import os
import sys

CONSOLE_SCRIPT = "llamaswap"
# Set in each model process's environment (inherited by everything it forks): finds the group's
# survivors after a restart even when the group leader is gone.
PROCESS_MARKER_VARIABLE = "LLAMASWAP_PROCESS_MARKER"
# Also set in it: who started the group ("<data> <pid> <start ticks> <model>", see `proxy.model_processes.orphans`), so the
# next owner of the data finds the group even when its record never reached the database.
PROCESS_OWNER_VARIABLE = "LLAMASWAP_PROCESS_OWNER"
# Set to the GPUs placement gave the model (`hardware:`), comma-separated; "" for a model on the CPU.
GPUS_VARIABLE = "CUDA_VISIBLE_DEVICES"


def own_scripts_dir() -> str | None:
    """The directory of the `llamaswap` console script that runs this service, if it has one."""
    scripts = os.path.dirname(sys.executable)
    return scripts if os.access(os.path.join(scripts, CONSOLE_SCRIPT), os.X_OK) else None


def resolve_console_script(cmd: tuple[str, ...]) -> tuple[str, ...]:
    """`llamaswap …` runs the llamaswap serving this model, whatever else PATH holds."""
    scripts = own_scripts_dir()
    if cmd[0] == CONSOLE_SCRIPT and scripts is not None:
        return (os.path.join(scripts, CONSOLE_SCRIPT), *cmd[1:])
    return cmd


def child_environment(
    configured: tuple[tuple[str, str], ...],
    marker: str | None = None,
    owner: str | None = None,
    gpus: tuple[str, ...] | None = None,
) -> dict[str, str]:
    """The service's environment, the model's `env`, the group's marker and owner, its GPUs (when placed:
    None leaves the service's CUDA_VISIBLE_DEVICES as it is), and a PATH that finds `llamaswap`.

    The console script's directory goes at the end of PATH, not the front: it also holds the
    service's `python3` and `pip`, which must not replace the ones a model command means.
    """
    env = {**os.environ, **dict(configured)}
    if marker is not None:
        env[PROCESS_MARKER_VARIABLE] = marker
    if owner is not None:
        env[PROCESS_OWNER_VARIABLE] = owner
    if gpus is not None:
        env[GPUS_VARIABLE] = ",".join(gpus)
    scripts = own_scripts_dir()
    path = env.get("PATH", os.defpath).split(os.pathsep)
    if scripts is not None and scripts not in path:
        env["PATH"] = os.pathsep.join([*filter(None, path), scripts])
    return env
