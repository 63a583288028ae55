"""`performance:` — the system and GPU sampler that feeds /metrics (`llamaswap_cpu_*`, `_memory_*`, `_gpu_*`…).

`every` is written as a Go duration ("5s", "1m30s", "500ms"), as in llama-swap's
config; values below 5 s are raised to 5 s with a warning, as llama-swap does,
so a typo cannot turn the sampler into a busy loop, and values above 24 h are refused.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import kind_of
from .fields import MISSING, Section

DEFAULT_EVERY_S = 5.0
MIN_EVERY_S = 5.0
MAX_EVERY_S = 24 * 3600.0  # a sample a day is already stale; far beyond it the sampler's wait cannot be armed

_UNIT_SECONDS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")


@dataclass(frozen=True)
class PerformanceConfig:
    disabled: bool = False
    every: float = DEFAULT_EVERY_S  # seconds between samples


def parse_duration(text: str) -> float | None:
    """Seconds in a Go duration string ("1m30s"), or None when it is not one."""
    text = text.strip()
    if text == "0":
        return 0.0
    position, total = 0, 0.0
    while position < len(text):
        match = _PART.match(text, position)
        if match is None:
            return None
        total += float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
        position = match.end()
    return total if text else None


def read_performance(top: Section) -> PerformanceConfig:
    section = top.section("performance")
    if section is None:
        return PerformanceConfig()
    disabled = section.boolean("disabled", False)
    every = DEFAULT_EVERY_S
    value = section.expanded("every", typed=False)
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        seconds = parse_duration(str(value))
        if seconds is None:
            section.error(
                "every",
                f'"{value}" is not a duration — write a number with a unit (ms, s, m, h), e.g. every: 5s or every: 1m30s',
            )
        elif seconds > MAX_EVERY_S:
            section.error("every", f"{value} is above the maximum of 24h — e.g. every: 5s or every: 1h")
        elif seconds < MIN_EVERY_S:
            section.log.warn(
                section.path("every"), f"{value} is below the minimum of {MIN_EVERY_S:g}s, using {MIN_EVERY_S:g}s"
            )
            every = MIN_EVERY_S
        else:
            every = seconds
    elif value is not None and value is not MISSING:
        section.error("every", f"expected a duration, got {kind_of(value)} — e.g. every: 5s")
    section.warn_unread()
    return PerformanceConfig(disabled=disabled, every=every)
