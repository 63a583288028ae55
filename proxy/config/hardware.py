"""`hardware:` (each GPU's memory, optionally the CPU's) and each model's `memory:` and `gpus:`.

With them, placement decides which models run together by what fits (`scheduling.core.placement`), so
every model must say what it needs, and a model that could never fit is a config error, not a request
that waits forever. Sizes are a whole number of MiB or a number with a unit: MiB and GiB are binary,
MB and GB decimal (1 GB = 10^9 bytes), as GPU tools and model cards both write them; a size is
rounded up to whole MiB, since placement counts MiB and a need must never be understated.
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from scheduling.core.placement import Hardware, MemoryNeed, Resident, assign, fits_at_all

from .errors import ProblemLog, kind_of
from .fields import MISSING, Section
from .frozen import FrozenDict

MIB = 2**20
MAX_MIB = 2**40  # 1 EiB: far above any machine, far below what a 64-bit count of bytes holds
UNIT_BYTES = {"mib": MIB, "gib": 2**30, "mb": 10**6, "gb": 10**9}
MAX_DIGITS = 40  # a longer number is a typo, and exact arithmetic on it would only cost time
_SIZE = re.compile(r"([+-]?)([0-9]*)(?:\.([0-9]*))?\s*([^0-9\s.+-]*)")
SIZE_FIX = "write a whole number of MiB, or a number with MiB, GiB, MB or GB"
GPUS_EXAMPLE = "gpus: [{id: 0, memory: 24GiB}]"


LARGEST_GPU_MIB = 1024 * 1024  # no GPU has a TiB: a figure above is a unit mistaken (bytes written as MiB)


class SizeError(ValueError):
    """Why a value is not a size (the fix is added by whoever reports it)."""


def parse_size(value: Any) -> int:
    """The MiB a config size stands for (see the module's docstring); SizeError when it is none."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise SizeError(f"expected a size, got {kind_of(value)}")
    if isinstance(value, float):
        if not math.isfinite(value):
            raise SizeError(f"{value} is not a finite size")
        if not value.is_integer():
            raise SizeError(f"{value:g} is not a whole number of MiB")
        value = int(value)  # 1e3, as YAML 1.2 reads it
    if isinstance(value, int):
        sign, whole, fraction, unit = ("-" if value < 0 else ""), str(abs(value)), None, ""
    else:
        match = _SIZE.fullmatch(value.strip())
        if match is None or not (match.group(2) or match.group(3)):
            raise SizeError(f'"{value}" is not a size')
        sign, whole, fraction, unit = match.groups()
    if unit and unit.lower() not in UNIT_BYTES:
        raise SizeError(f'"{value}" has an unknown unit "{unit}"')
    if fraction and not unit:
        raise SizeError(f'"{value}" is not a whole number of MiB')
    if len(whole.lstrip("0")) > MAX_DIGITS:
        raise SizeError(f"{value} is above the maximum of 2^40 MiB (1 EiB)")
    if len(fraction or "") > MAX_DIGITS:
        raise SizeError(f'"{value}" has more than {MAX_DIGITS} decimals')
    number = Fraction(f"{whole or 0}.{fraction or 0}")
    if number == 0:
        raise SizeError(f"{value} is zero")
    if sign == "-":
        raise SizeError(f"{value} is negative")
    mib = math.ceil(number * UNIT_BYTES[unit.lower() or "mib"] / MIB)
    if mib > MAX_MIB:
        raise SizeError(f"{value} is above the maximum of 2^40 MiB (1 EiB)")
    return mib


def read_size(section: Section, name: str, *, example: str) -> int | None:
    """The size at `name` in MiB; None (the problem logged) when it is absent or not a size."""
    value = section.expanded(name)
    if value is MISSING or value is None:
        return None
    try:
        return parse_size(value)
    except SizeError as exc:
        section.error(name, f"{exc} — {SIZE_FIX}, e.g. {name}: {example}")
        return None


@dataclass(frozen=True)
class HardwareSection:
    """What `hardware:` says, for the models' checks: whether it is written at all, and the hardware
    once it is valid (None while it has problems: the models' fit is then not judged against it)."""

    given: bool = False
    hardware: Hardware | None = None


def read_hardware(top: Section) -> HardwareSection:
    if top.raw("hardware", None) is None:
        return HardwareSection()
    section = top.section("hardware")
    if section is None:
        return HardwareSection(given=True)
    gpus = _read_gpus(section)
    cpu = section.section("cpu")
    cpu_mib = None
    cpu_valid = True
    if cpu is not None:
        if not cpu.has("memory"):
            cpu.error("memory", "missing — say how much memory CPU-only models (gpus: 0) may take, e.g. memory: 64GiB")
        cpu_mib = read_size(cpu, "memory", example="64GiB")
        cpu_valid = cpu_mib is not None
        cpu.warn_unread()
    section.warn_unread()
    if gpus is None or not cpu_valid:
        return HardwareSection(given=True)
    return HardwareSection(given=True, hardware=Hardware(gpus=FrozenDict(gpus), cpu_mib=cpu_mib))


def _read_gpus(section: Section) -> dict[str, int] | None:
    """`hardware.gpus`: MiB by id, in the file's order; None when any entry has a problem."""
    entries = section.raw("gpus")
    if entries is MISSING or entries is None:
        section.error("gpus", f"missing — list each GPU with its id and memory, e.g. {GPUS_EXAMPLE}")
        return None
    if not isinstance(entries, list):
        section.error("gpus", f"expected a list of GPUs, got {kind_of(entries)} — e.g. {GPUS_EXAMPLE}")
        return None
    if not entries:
        section.error("gpus", f"is empty — list each GPU with its id and memory, e.g. {GPUS_EXAMPLE}, or remove `hardware:`")
        return None
    gpus: dict[str, int] = {}
    where: dict[str, str] = {}
    valid = True
    for index, entry in enumerate(entries):
        key = f"{section.path('gpus')}[{index}]"
        if not isinstance(entry, dict):
            section.log.error(key, f"expected a mapping with id and memory, got {kind_of(entry)} — e.g. {{id: {index}, memory: 24GiB}}")
            valid = False
            continue
        gpu = Section(entry, key, section.log, section.scope)
        gpu_id = _read_gpu_id(gpu, index)
        if not gpu.has("memory"):
            gpu.error("memory", "missing — how much memory this GPU has, e.g. memory: 24GiB")
        mib = read_size(gpu, "memory", example="24GiB")
        gpu.warn_unread()
        if gpu_id is not None and gpu_id in where:
            gpu.error("id", f'"{gpu_id}" is also the id of {where[gpu_id]} — give each GPU its own id')
            gpu_id = None
        elif gpu_id is not None:
            where[gpu_id] = key
        if gpu_id is None or mib is None:
            valid = False
            continue
        if mib > LARGEST_GPU_MIB:
            gpu.log.warn(gpu.path("memory"), f"{mib} MiB is over 1 TiB, more than any GPU has — a bare number is MiB; "
                                             "write the unit, e.g. memory: 24GiB")
        gpus[gpu_id] = mib
    return gpus if valid else None


def _read_gpu_id(gpu: Section, index: int) -> str | None:
    """A GPU's id as CUDA_VISIBLE_DEVICES takes it: its index (a whole number) or its UUID, as text."""
    fix = f"write the GPU's index or UUID as CUDA_VISIBLE_DEVICES takes it, e.g. id: {index}"
    value = gpu.expanded("id")
    if value is MISSING:
        if not gpu.has("id"):
            gpu.error("id", f"missing — {fix}")
        return None
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        gpu.error("id", f"expected text or a whole number, got {kind_of(value)} — {fix}")
        return None
    text = str(value)
    if isinstance(value, int) and value < 0:
        gpu.error("id", f"{value} is negative — {fix}")
    elif not text or "," in text or any(char.isspace() for char in text):
        gpu.error("id", f'"{text}" is empty or has a comma or a space, which CUDA_VISIBLE_DEVICES cannot hold — {fix}')
    else:
        return str(int(text)) if text.isdigit() else text  # "00" is GPU 0 to CUDA_VISIBLE_DEVICES, so to us
    return None


def read_model_memory(section: Section, hardware: HardwareSection) -> MemoryNeed | None:
    """A model's `memory:` and `gpus:`, checked against the hardware: None without `hardware:` (or while
    anything is wrong, which is then reported)."""
    if not hardware.given:
        for name in ("memory", "gpus"):
            if section.has(name):
                section.raw(name)
                section.error(
                    name,
                    "is set, but there is no top-level `hardware:` section to place the model on — "
                    f"describe the GPUs (hardware: {{{GPUS_EXAMPLE}}}), or remove {name}",
                )
        return None
    gpus = section.integer("gpus", 1, minimum=0, example="2")
    if not section.has("memory"):
        section.error(
            "memory",
            "missing — with a top-level `hardware:` section every model says what it needs on each GPU it uses, "
            "e.g. memory: 8GiB (with gpus: 0, of the CPU's memory)",
        )
    mib = read_size(section, "memory", example="8GiB")
    if mib is None or hardware.hardware is None:
        return None
    return _checked_need(section, hardware.hardware, MemoryNeed(mib, gpus))


def _checked_need(section: Section, hardware: Hardware, need: MemoryNeed) -> MemoryNeed | None:
    """`need`, or None when it can never fit, even on empty hardware (no eviction would ever help)."""
    count = len(hardware.gpus)
    if need.gpus > count:
        section.error("gpus", f"{need.gpus} is more than the {count} GPU{'s' if count > 1 else ''} under hardware.gpus — use at most {count}, or add the others there")
        return None
    if fits_at_all(hardware, need):
        return need
    if need.gpus == 0:
        section.error(
            "memory",
            f"{need.mib} MiB is more than hardware.cpu.memory ({hardware.cpu_mib} MiB), so this CPU-only model "
            "could never start — lower memory, or raise hardware.cpu.memory",
        )
        return None
    largest = max(hardware.gpus, key=hardware.gpus.__getitem__)  # the first of the largest, in the file's order
    roomy = sum(mib >= need.mib for mib in hardware.gpus.values())
    largest_text = f"the largest, GPU {largest}, has {hardware.gpus[largest]} MiB"
    if need.gpus == 1:
        section.error(
            "memory",
            f"{need.mib} MiB is more than any GPU has ({largest_text}), so the model could never start — "
            "lower memory, spread the model over more GPUs (gpus: 2), or fix hardware.gpus",
        )
    else:
        section.error(
            "memory",
            f"{need.mib} MiB on each of {need.gpus} GPUs fits on no {need.gpus} GPUs even with nothing else loaded: "
            f"{roomy} of them {'has' if roomy == 1 else 'have'} that much ({largest_text}) — lower memory or gpus, "
            "or fix hardware.gpus",
        )
    return None


ORDERS_TRIED = 720  # every order of up to 6 pinned models; beyond, the largest first


def warn_unfitting_pins(hardware: HardwareSection, pinned: dict[str, MemoryNeed], log: ProblemLog) -> None:
    """Warn when the pinned models cannot all be loaded at once: a pin is never stopped to make room, so whichever
    load first keep the others out for good (their requests wait for an operator's unload)."""
    if hardware.hardware is None or len(pinned) < 2:
        return
    orders = itertools.islice(itertools.permutations(sorted(pinned, key=lambda m: -pinned[m].mib)), ORDERS_TRIED)
    for order in orders:
        residents: list[Resident] = []
        for model in order:
            gpus = assign(hardware.hardware, pinned[model], residents)
            if gpus is None:
                break
            residents.append(Resident(model, gpus, pinned[model].mib))
        else:
            return
    log.warn("models", f"the pinned models {', '.join(sorted(pinned))} cannot all be loaded at once on the memory "
                       "under hardware: — a pinned model is never stopped to make room, so those loaded first keep "
                       "the others out (their requests wait for an operator's unload); unpin one, lower a memory: or "
                       "describe more memory")
