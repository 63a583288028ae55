"""`logToStdout` and `logTimeFormat`: where llamaswap's log lines and its models' output are written,
and how the time at the start of each line reads.

Both keys are llama-swap's. When neither is set, llamaswap writes as it always has: its own lines on
stderr, each starting with the local time; so adding llamaswap to an existing setup changes nothing
until a key asks for it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from .errors import kind_of
from .fields import MISSING, Section

LOG_DESTINATIONS = ("proxy", "upstream", "both", "none")


def _fraction(digits: int) -> Callable[[datetime], str]:
    return lambda t: "." + f"{t.microsecond:06d}{'000' if digits == 9 else ''}"[:digits]


def _zone(t: datetime) -> str:
    return t.strftime("%Z") or t.strftime("%z")


def _rfc3339(t: datetime, nano: bool) -> str:
    """Go's RFC3339 / RFC3339Nano: `Z` for UTC, the fraction without its trailing zeros."""
    text = t.strftime("%Y-%m-%dT%H:%M:%S")
    if nano and t.microsecond:
        text += f".{t.microsecond:06d}".rstrip("0")
    offset = t.strftime("%z")
    return text + ("Z" if offset in ("+0000", "") else f"{offset[:3]}:{offset[3:]}")


def _day(t: datetime) -> str:
    return f"{t.day:2d}"  # Go's `_2`: the day padded with a space


# Go's time layout constants by their lower-case names (https://pkg.go.dev/time#pkg-constants).
TIME_LAYOUTS: dict[str, Callable[[datetime], str]] = {
    "ansic": lambda t: t.strftime(f"%a %b {_day(t)} %H:%M:%S %Y"),
    "unixdate": lambda t: t.strftime(f"%a %b {_day(t)} %H:%M:%S {_zone(t)} %Y"),
    "rubydate": lambda t: t.strftime("%a %b %d %H:%M:%S %z %Y"),
    "rfc822": lambda t: t.strftime(f"%d %b %y %H:%M {_zone(t)}"),
    "rfc822z": lambda t: t.strftime("%d %b %y %H:%M %z"),
    "rfc850": lambda t: t.strftime(f"%A, %d-%b-%y %H:%M:%S {_zone(t)}"),
    "rfc1123": lambda t: t.strftime(f"%a, %d %b %Y %H:%M:%S {_zone(t)}"),
    "rfc1123z": lambda t: t.strftime("%a, %d %b %Y %H:%M:%S %z"),
    "rfc3339": lambda t: _rfc3339(t, nano=False),
    "rfc3339nano": lambda t: _rfc3339(t, nano=True),
    "kitchen": lambda t: t.strftime("%I:%M%p").lstrip("0"),
    "stamp": lambda t: t.strftime(f"%b {_day(t)} %H:%M:%S"),
    "stampmilli": lambda t: t.strftime(f"%b {_day(t)} %H:%M:%S") + _fraction(3)(t),
    "stampmicro": lambda t: t.strftime(f"%b {_day(t)} %H:%M:%S") + _fraction(6)(t),
    "stampnano": lambda t: t.strftime(f"%b {_day(t)} %H:%M:%S") + _fraction(9)(t),
}


@dataclass(frozen=True)
class LogOutput:
    """None: the key is not in the file, and llamaswap keeps its own behaviour (see the module)."""

    to_stdout: str | None = None
    time_format: str | None = None

    @property
    def own_lines_on_stdout(self) -> bool:
        return self.to_stdout in ("proxy", "both")

    @property
    def model_output_on_stdout(self) -> bool:
        return self.to_stdout in ("upstream", "both")


def read_log_output(top: Section) -> LogOutput:
    return LogOutput(to_stdout=_choice(top, "logToStdout", LOG_DESTINATIONS),
                     time_format=_choice(top, "logTimeFormat", ("", *TIME_LAYOUTS)))


def _choice(top: Section, name: str, allowed: tuple[str, ...]) -> str | None:
    value = top.expanded(name, typed=False)
    if value is MISSING or value is None:  # a null is the default, as for every key
        return None
    shown = ", ".join(f'"{choice}"' for choice in allowed)
    if not isinstance(value, str):
        top.error(name, f"expected text, got {kind_of(value)} — use one of {shown}")
        return None
    value = value.strip().lower()
    if value not in allowed:
        top.error(name, f'"{value}" is not one of {shown}')
        return None
    return value
