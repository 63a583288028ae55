"""Token counts and speeds from an upstream response, by llama-swap's activity-log rules.

Only the tail of a stream is kept (usage arrives in the last events), so the
relay does no per-chunk parsing.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

# 16 events of the usual two-line shape ("data: ...", blank line), twice over for multi-line events.
_TAIL_LINES = 64


def usage_from_json(payload: Any) -> dict[str, Any]:
    """Columns from a JSON response (for `/infill`, an array, the last element)."""
    if isinstance(payload, list) and payload:
        payload = payload[-1]
    if not isinstance(payload, dict):
        return {}
    out: dict[str, Any] = {}
    for usage in (payload.get("usage"), _get(payload, "response", "usage"), _get(payload, "message", "usage")):
        if isinstance(usage, dict):
            out.update(_from_usage(usage))
            break
    timings = payload.get("timings")
    if isinstance(timings, dict):
        out.update(_from_timings(timings))
    return out


def usage_from_sse(tail: Sequence[bytes]) -> dict[str, Any]:
    """Columns from the last events of a server-sent-events stream; the last usage/timings seen wins.

    `tail` is what the relay kept of the stream's end, in pieces of any size; only its last
    `_TAIL_LINES` lines are parsed, as a fast stream's pieces can hold thousands of events each.
    """
    out: dict[str, Any] = {}
    for line in _last_lines(tail, _TAIL_LINES):
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if not data.startswith("{"):
            continue
        try:
            payload = json.loads(data)
        except (json.JSONDecodeError, RecursionError):
            continue  # the first line of the tail may be cut; a hostile one may nest too deeply to read
        out.update(usage_from_json(payload))
    return out


def _last_lines(pieces: Sequence[bytes], count: int) -> list[str]:
    """The last `count` lines of the concatenated `pieces` (the first may be cut), reading only the pieces that hold them."""
    needed: list[bytes] = []
    newlines = 0
    for piece in reversed(pieces):
        needed.append(piece)
        newlines += piece.count(b"\n")
        if newlines > count:
            break
    parts = b"".join(reversed(needed)).rsplit(b"\n", count)
    if len(parts) > count:
        del parts[0]  # all that came before those lines
    # A stream that ends its lines with a bare CR (as SSE allows) comes as one part, split here.
    return [line for part in parts for line in part.decode("utf-8", "replace").splitlines()]


def _get(payload: dict, *keys: str) -> Any:
    for key in keys:
        if not isinstance(payload, dict):
            return None
        payload = payload.get(key)
    return payload


def _int(value: Any) -> int | None:
    """A count the upstream reported; None unless it is a finite number (JSON allows 1e400 and NaN)."""
    return int(value) if _finite(value) else None


def _finite(value: Any) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return not isinstance(value, float) or math.isfinite(value)


def _from_usage(usage: dict) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for column, keys in (("input_tokens", ("prompt_tokens", "input_tokens")), ("output_tokens", ("completion_tokens", "output_tokens"))):
        for key in keys:
            if _int(usage.get(key)) is not None:
                out[column] = _int(usage[key])
                break
    for cached in (
        usage.get("cache_read_input_tokens"),
        _get(usage, "input_tokens_details", "cached_tokens"),
        _get(usage, "prompt_tokens_details", "cached_tokens"),
    ):
        if _int(cached) is not None:
            out["cache_tokens"] = _int(cached)
            break
    return out


def _from_timings(timings: dict) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for column, key in (("input_tokens", "prompt_n"), ("output_tokens", "predicted_n"), ("cache_tokens", "cache_n")):
        if _int(timings.get(key)) is not None:
            out[column] = _int(timings[key])
    for column, key in (("prompt_per_second", "prompt_per_second"), ("tokens_per_second", "predicted_per_second")):
        value = timings.get(key)
        if _finite(value):
            out[column] = value  # the recorder stores one beyond a float's range as unknown
    return out
