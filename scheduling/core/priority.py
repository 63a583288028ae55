"""Request priority: the `X-LlamaSwap-Priority` header and the bands it falls into.

The number is the interface; aliases are a convenience. Anything a caller sends
that is not a plain signed 64-bit integer or an alias means "normal" (0), so a
typo can never make a request more urgent than intended.
"""

from __future__ import annotations

import enum
import re

PRIORITY_HEADER = "X-LlamaSwap-Priority"
PRIORITY_ALIASES = {"interactive": 100, "normal": 0, "batch": -100}
BAND_SPACING = 100

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
_INT64_DIGITS = len(str(INT64_MAX))
# ASCII digits only: str.isdigit() and int() would accept "١٢" and "1_0".
_SIGNED_INTEGER = re.compile(r"[+-]?[0-9]+")
# HTTP optional whitespace plus line breaks; other characters are part of the value.
_SURROUNDING_WHITESPACE = " \t\r\n\f\v"


def parse_priority(value: str | bytes | None) -> int:
    """The caller's priority, or 0 when the header is absent or not a valid value (`readable_priority` tells).

    Accepts a signed decimal integer within signed 64 bits (leading "+" or "-")
    or an alias, case-insensitive, ignoring surrounding whitespace. Values are
    not clamped: the header is trusted. Bytes (as ASGI delivers headers) are
    read as latin-1, which decodes every byte.
    """
    if value is None:
        return 0
    text = value.decode("latin-1") if isinstance(value, bytes) else value
    text = text.strip(_SURROUNDING_WHITESPACE)
    alias = PRIORITY_ALIASES.get(text.lower())
    if alias is not None:
        return alias
    if _SIGNED_INTEGER.fullmatch(text) is None:
        return 0
    sign = "-" if text.startswith("-") else ""
    digits = text.lstrip("+-").lstrip("0") or "0"
    if len(digits) > _INT64_DIGITS:
        return 0  # out of range; int() would also refuse strings past 4300 digits
    number = int(sign + digits)
    if not INT64_MIN <= number <= INT64_MAX:
        return 0
    return number


def readable_priority(text: str) -> bool:
    """Whether `parse_priority` reads `text` as what it says, rather than as 0 for want of a value."""
    text = text.strip(_SURROUNDING_WHITESPACE)
    return parse_priority(text) != 0 or text.lower() in PRIORITY_ALIASES or re.fullmatch(r"[+-]?0+", text) is not None


class Band(enum.StrEnum):
    """Coarse label of a priority, for metrics and the activity log."""

    INTERACTIVE = "interactive"
    NORMAL = "normal"
    BATCH = "batch"


def band_of(priority: float) -> Band:
    """The band a priority belongs to: the nearest anchor, split halfway between anchors."""
    if priority >= BAND_SPACING / 2:
        return Band.INTERACTIVE
    if priority <= -BAND_SPACING / 2:
        return Band.BATCH
    return Band.NORMAL
