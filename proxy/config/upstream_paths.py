"""`upstream.ignorePaths`: `/upstream/<model>/<path>` requests that must never load a model.

A model's web UI fetches scripts, styles and icons; a browser tab left open would otherwise start
(or keep queueing for) the model on every asset request. Such a path is served only by a model
that is already ready.
"""

from __future__ import annotations

import re

from .errors import kind_of
from .fields import MISSING, Section

# llama-swap's default: static-asset suffixes. Like Go's regexp, a pattern matches anywhere in the path.
DEFAULT_IGNORE_PATHS = (re.compile(r".*\.(js|json|css|png|gif|jpg|jpeg|ico|txt)$"),)


def read_ignore_paths(top: Section) -> tuple[re.Pattern, ...]:
    """The compiled patterns; an absent or empty list means the default, as in llama-swap."""
    upstream = top.section("upstream")
    if upstream is None:
        return DEFAULT_IGNORE_PATHS
    value = upstream.expanded("ignorePaths", typed=False)
    upstream.warn_unread()
    if value is MISSING or value is None:
        return DEFAULT_IGNORE_PATHS
    if not isinstance(value, list):
        upstream.error("ignorePaths", f"expected a list of regular expressions, got {kind_of(value)} — e.g. ignorePaths: ['\\.png$']")
        return DEFAULT_IGNORE_PATHS
    patterns = []
    for index, text in enumerate(value):
        key = f"{upstream.path('ignorePaths')}[{index}]"
        if not isinstance(text, str):
            upstream.log.error(key, f"expected a regular expression, got {kind_of(text)} — quote it")
            continue
        try:
            patterns.append(re.compile(text))
        except re.error as exc:
            upstream.log.error(key, f"{text!r} is not a valid regular expression ({exc}) — it is Python `re` syntax")
    return tuple(patterns) or DEFAULT_IGNORE_PATHS


def is_ignored(path: str, patterns: tuple[re.Pattern, ...]) -> bool:
    """Whether `path` (`/` and what follows the model name, without the query) matches one pattern."""
    return any(pattern.search(path) for pattern in patterns)
