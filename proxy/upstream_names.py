"""The model names an `/upstream/<rest>` path may begin with.

Model IDs may hold '/', so each run of leading segments is a candidate, the longest first. Only runs no
longer than the longest name that could match are tried, so a path of thousands of '/' costs what a short
one does (joining every run of segments would cost the square of the path's length, on the event loop).
"""

from __future__ import annotations

from collections.abc import Iterator


def leading_names(rest: str, longest: int) -> Iterator[tuple[str, str | None]]:
    """(a run of `rest`'s leading segments, what follows it), longest first, for runs of at most `longest`
    characters; what follows is None when the run is all of `rest`."""
    ends = [index for index, char in enumerate(rest[: longest + 1]) if char == "/"]
    if len(rest) <= longest:
        ends.append(len(rest))
    for end in reversed(ends):
        yield rest[:end], (rest[end + 1:] if end < len(rest) else None)
