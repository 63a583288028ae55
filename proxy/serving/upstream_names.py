"""The model names an `/upstream/<rest>` path may begin with.

Model IDs may hold '/', so each run of leading segments is a candidate, the longest first. Only runs no
longer than the longest name that could match are tried, so a path of thousands of '/' costs what a short
one does (joining every run of segments would cost the square of the path's length, on the event loop).
"""

from __future__ import annotations

from collections.abc import Iterator
from urllib.parse import unquote


def leading_names(rest: str, longest: int) -> Iterator[tuple[str, str | None]]:
    """(a run of `rest`'s leading segments, percent-decoded, what follows it as sent), longest first, for
    runs whose name is at most `longest` characters; what follows is None when the run is all of `rest`.
    A client may send a model's name encoded (`my%20model`, `org%2Fmodel`): it is cut at the '/' it sent
    and decoded, and each decoded character took at most three sent ones."""
    reach = 3 * longest
    ends = [index for index, char in enumerate(rest[: reach + 1]) if char == "/"]
    if len(rest) <= reach:
        ends.append(len(rest))
    for end in reversed(ends):
        name = unquote(rest[:end])
        if len(name) <= longest:
            yield name, (rest[end + 1:] if end < len(rest) else None)
