"""Whole numbers typed into a request: query parameters, path segments, form fields.

Python's int() refuses text of more than 4300 digits (a ValueError, so a 500), and the database's
integers stop at 2**63 - 1. Text is measured against the bound before it is converted.
"""

from __future__ import annotations

ROW_ID_MAX = 2**63 - 1  # the largest id a row can have: the primary key is a signed 64-bit integer


def whole_number(text: str, high: int = ROW_ID_MAX) -> int | None:
    """`text`, ASCII digits only, as a number no greater than `high`; None for anything else."""
    if not (text.isascii() and text.isdigit()):
        return None
    digits = text.lstrip("0") or "0"
    if len(digits) > len(str(high)):
        return None
    value = int(digits)
    return value if value <= high else None


def as_typed(text: str, room: int = 40) -> str:
    """`text` for an error message: as typed, or its start and its length when longer than `room`."""
    return text if len(text) <= room else f"{text[:room // 2]}… ({len(text)} characters)"
