"""What each model's processes use of GPU memory, measured with `nvidia-smi` where it exists.

A model declares its memory (`memory:`); a context size or a KV cache larger than thought makes it use more,
and placement, trusting the declaration, would start models beside it into memory that is not there. So
once a model is healthy, before it counts as ready (`measure_started`: nothing is placed beside it on its
declaration alone after that), and every `MEASURE_EVERY_S` while it stays loaded (caches grow), its use per
GPU is measured and told to the scheduler, which shows it beside the declaration and counts the larger of the two.

A model's use is what nvidia-smi reports for its processes: the one started and everything it started
(models often run through `sh -c` or a wrapper script), found in /proc. A GPU is named as `hardware.gpus`
names it, by UUID or index. nvidia-smi runs as a subprocess with a deadline, never on the event loop's
time; one that is missing, fails, hangs or prints what is not understood leaves the figures absent and
is said once, and nothing else changes: a start waits for no measurement again until nvidia-smi answers.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import shutil
import signal
from collections.abc import Callable, Iterable, Mapping

from proxy.model_processes import proctable
from proxy.model_processes.process_groups import signal_group

log = logging.getLogger("llamaswap.gpu_memory")

# The nvidia-smi to run: unset finds `nvidia-smi` on PATH; a path (or a name on PATH) names another; ""
# measures nothing.
COMMAND_SETTING = "LLAMASWAP_NVIDIA_SMI"
MEASURE_EVERY_S = 15.0
CHECK_EVERY_S = 1.0  # how soon a model that became ready is measured
ANSWER_TIMEOUT_S = 5.0  # nvidia-smi answers in well under a second; a wedged driver must not hold the figures

COMPUTE_APPS = ("--query-compute-apps=pid,gpu_uuid,used_memory", "--format=csv,noheader,nounits")
GPU_INDEXES = ("--query-gpu=index,uuid", "--format=csv,noheader,nounits")


def nvidia_smi_command(environ: Mapping[str, str] = os.environ) -> str | None:
    """The nvidia-smi to run (see `COMMAND_SETTING`), None when there is none."""
    setting = environ.get(COMMAND_SETTING)
    if setting == "":
        return None
    return shutil.which(setting or "nvidia-smi")


def parse_compute_apps(text: str) -> dict[int, dict[str, int]]:
    """`nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory --format=csv,noheader,nounits`: each process's
    MiB by GPU UUID. A line that is not `pid, uuid, MiB` ("No running processes found", a used memory of
    "[N/A]" as some drivers and containers print) is left out."""
    apps: dict[int, dict[str, int]] = {}
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.split(",")]
        if len(cells) != 3 or not whole_number(cells[0]) or not cells[1] or not whole_number(cells[2]):
            continue
        on = apps.setdefault(int(cells[0]), {})
        on[cells[1]] = on.get(cells[1], 0) + int(cells[2])
    return apps


def parse_gpu_indexes(text: str) -> dict[str, str]:
    """`nvidia-smi --query-gpu=index,uuid --format=csv,noheader,nounits`: each GPU's index by its UUID."""
    indexes = {}
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.split(",")]
        if len(cells) == 2 and whole_number(cells[0]) and cells[1]:
            indexes[cells[1]] = cells[0]
    return indexes


def whole_number(cell: str) -> bool:
    """Whether a cell is a whole number as nvidia-smi writes one (not "[N/A]"; `str.isdigit` also takes "²")."""
    return cell.isascii() and cell.isdigit()


def use_of(pids: Iterable[int], apps: Mapping[int, Mapping[str, int]], indexes: Mapping[str, str],
           gpu_ids: Iterable[str]) -> dict[str, int]:
    """What the processes `pids` use, MiB by GPU: named by its UUID where `gpu_ids` (hardware.gpus) does,
    else by its index."""
    configured = set(gpu_ids)
    use: dict[str, int] = {}
    for pid in pids:
        for uuid, mib in apps.get(pid, {}).items():
            gpu = uuid if uuid in configured else indexes.get(uuid, uuid)
            use[gpu] = use.get(gpu, 0) + mib
    return use


async def ask(command: str, arguments: tuple[str, ...], timeout: float = ANSWER_TIMEOUT_S) -> str:
    """nvidia-smi's output; raises OSError or RuntimeError when it cannot run, fails, or outlives `timeout`
    (then it is killed, with anything it started)."""
    process = await asyncio.create_subprocess_exec(
        command, *arguments, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, start_new_session=True,
    )
    try:
        out, err = await asyncio.wait_for(process.communicate(), timeout)
    except TimeoutError:
        signal_group(process.pid, signal.SIGKILL)
        await process.wait()
        raise RuntimeError(f"{command} did not answer within {timeout:g}s") from None
    if process.returncode != 0:
        detail = (err or out).decode(errors="replace").strip().splitlines()
        raise RuntimeError(f"{command} exited with {process.returncode}: {detail[0] if detail else 'no output'}")
    return out.decode(errors="replace")


class GpuMemoryWatch:
    """Measures the models of `fleet` (a `ProcessFleet`) as each becomes ready and every `MEASURE_EVERY_S`, with
    `hardware:` described; tells `report(model, MiB by GPU)` of each model whose processes use a GPU."""

    def __init__(self, command: str, fleet, report: Callable[[str, dict[str, int]], None],
                 every: float = MEASURE_EVERY_S, timeout: float = ANSWER_TIMEOUT_S) -> None:
        self.command = command
        self.fleet = fleet
        self.report = report
        self.every = every
        self.timeout = timeout
        self._said: set[str] = set()
        self._seen: dict[str, int] = {}  # model -> the pid last measured
        self._answering = True  # nvidia-smi answered the last time it was asked

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        last = -math.inf
        while True:
            ready = self.fleet.ready_pids() if self.fleet.config.hardware is not None else {}
            new = any(self._seen.get(m) != pid for m, pid in ready.items())
            if ready and (loop.time() - last >= self.every or new):
                self._seen, last = dict(ready), loop.time()
                await self._measure_and_report(ready)
            await asyncio.sleep(CHECK_EVERY_S)

    async def measure_started(self, model: str, pid: int) -> None:
        """Measure `model`, healthy as `pid`, before it counts as ready: a request for another model placed the
        moment it is ready counts what it uses, not a declaration found short. Skipped while nvidia-smi does not
        answer, so one that hangs holds up one start, by its deadline, and no more until it answers again."""
        if self.fleet.config.hardware is None or not self._answering:
            return
        self._seen[model] = pid
        await self._measure_and_report({model: pid})

    async def _measure_and_report(self, pids: Mapping[str, int]) -> None:
        try:
            for model, use in (await self.measure(pids)).items():
                self.report(model, use)
        except Exception:  # a fault here must not end measuring for the life of the service
            log.exception("measuring GPU memory failed")

    async def measure(self, pids: Mapping[str, int]) -> dict[str, dict[str, int]]:
        """What the models whose processes started as `pids` (model -> pid) use, MiB by GPU; a model none of
        whose processes nvidia-smi lists is left out (it may run where nvidia-smi cannot see it: a container)."""
        try:
            apps = parse_compute_apps(await ask(self.command, COMPUTE_APPS, self.timeout))
            indexes = parse_gpu_indexes(await ask(self.command, GPU_INDEXES, self.timeout)) if apps else {}
        except (OSError, RuntimeError) as exc:
            self._answering = False
            self._say_once(f"GPU memory is not measured ({exc}); placement counts the declared figures")
            return {}
        self._answering = True
        gpu_ids = tuple(self.fleet.config.hardware.gpus) if self.fleet.config.hardware is not None else ()
        families = await asyncio.to_thread(lambda: {m: proctable.family(pid) or {pid} for m, pid in pids.items()})
        uses = {m: use_of(family, apps, indexes, gpu_ids) for m, family in families.items()}
        return {m: use for m, use in uses.items() if use}

    def _say_once(self, message: str) -> None:
        if message not in self._said:
            self._said.add(message)
            log.warning("%s", message)
