"""A stand-in for `nvidia-smi`'s CSV queries, for tests on a machine without an NVIDIA GPU.

It reports `LLAMASWAP_FAKE_GPUS` GPUs (default 2) of 24 GiB, indexes 0, 1, … with UUIDs `GPU-fake-0`, …,
and as their compute processes the running fake model servers started with `--gpu-memory MIB`: each
wrote its pid, `CUDA_VISIBLE_DEVICES` and MiB into `LLAMASWAP_FAKE_GPU_DIR` (see `fakemodel.server`);
one whose process has exited is left out. Only the standard library, so it answers in a few tens of ms.

    python -m fakemodel.nvidia_smi --query-compute-apps=pid,gpu_uuid,used_memory --format=csv,noheader,nounits
    python -m fakemodel.nvidia_smi --query-gpu=index,uuid,memory.used,memory.total --format=csv,noheader,nounits

A field it does not know is "[N/A]", as nvidia-smi prints one a GPU does not report. Tests put a script named
`nvidia-smi` that runs this on PATH, or name it with `LLAMASWAP_NVIDIA_SMI`.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from fakemodel.server import GPU_DIR_VARIABLE

GPU_COUNT_VARIABLE = "LLAMASWAP_FAKE_GPUS"
GPU_MIB = 24_576
NOT_REPORTED = "[N/A]"


def uuid(index: int) -> str:
    return f"GPU-fake-{index}"


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def processes(directory: str | None, gpus: int) -> list[dict]:
    """One row per (live fake server, GPU it uses): pid, gpu index, MiB."""
    rows = []
    for path in sorted(Path(directory).glob("*.json")) if directory else ():
        try:
            state = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # being written, or gone
        if not alive(state["pid"]):
            continue
        visible = state.get("cuda_visible_devices")
        for device in ("0" if visible is None else visible).split(","):
            index = next((i for i in range(gpus) if device.strip() in (str(i), uuid(i))), None)
            if index is not None:
                rows.append({"pid": state["pid"], "index": index, "mib": state["mib"]})
    return rows


def answer(argv: list[str], environ: dict[str, str]) -> str:
    gpus = int(environ.get(GPU_COUNT_VARIABLE, "2"))
    apps = processes(environ.get(GPU_DIR_VARIABLE), gpus)
    queries = {arg.split("=", 1)[0]: arg.split("=", 1)[1].split(",") for arg in argv if "=" in arg}
    lines = []
    if fields := queries.get("--query-compute-apps"):
        for app in apps:
            known = {"pid": app["pid"], "gpu_uuid": uuid(app["index"]), "used_memory": app["mib"],
                     "process_name": "fakemodel"}
            lines.append(", ".join(str(known.get(field, NOT_REPORTED)) for field in fields))
    elif fields := queries.get("--query-gpu"):
        for index in range(gpus):
            used = sum(app["mib"] for app in apps if app["index"] == index)
            known = {"index": index, "uuid": uuid(index), "name": "Fake GPU", "memory.total": GPU_MIB,
                     "memory.used": used, "memory.free": GPU_MIB - used}
            lines.append(", ".join(str(known.get(field, NOT_REPORTED)) for field in fields))
    else:
        raise SystemExit("fake nvidia-smi: only --query-compute-apps=… and --query-gpu=… are answered")
    return "".join(line + "\n" for line in lines)


def main() -> int:
    sys.stdout.write(answer(sys.argv[1:], dict(os.environ)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
