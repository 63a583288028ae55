"""`upstream.ignorePaths`: `/upstream/<model>/<path>` requests that must never load a model.

A model's web UI fetches scripts, styles and icons; a browser tab left open would otherwise start
(or keep queueing for) the model on every asset request. Such a path is served only by a model
that is already ready.
"""

from __future__ import annotations

import re

from .errors import kind_of
from .fields import MISSING, Section


def compile_path_pattern(text: str) -> re.Pattern:
    """`text` compiled for `search`, without the leading `.*` (or `.*?`) patterns often start with.

    Searched for, `.*X` is found exactly where `X` is (the `.*` may match nothing), but Python's
    backtracking `re` retries the `.*` from every start position: quadratic in the path's length,
    so one long request path would hold the event loop for seconds (Go's RE2 is linear). A `.*`
    followed by a quantifier or a brace (`.*+`, `.*{`) is left alone: there it is not the redundant prefix.
    """
    original = re.compile(text)  # validated as written, so an error points into the user's text
    core = text
    while True:
        for prefix in (".*?", ".*"):
            rest = core[len(prefix):]
            if core.startswith(prefix) and not rest.startswith(("*", "+", "?", "{")):
                core = rest
                break
        else:
            break
    return re.compile(core) if core != text else original


# llama-swap's default: static-asset suffixes. Like Go's regexp, a pattern matches anywhere in the path.
DEFAULT_IGNORE_PATHS = (compile_path_pattern(r".*\.(js|json|css|png|gif|jpg|jpeg|ico|txt)$"),)


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
            patterns.append(compile_path_pattern(text))
        except re.error as exc:
            upstream.log.error(key, f"{text!r} is not a valid regular expression ({exc}) — it is Python `re` syntax")
    return tuple(patterns) or DEFAULT_IGNORE_PATHS


def is_ignored(path: str, patterns: tuple[re.Pattern, ...]) -> bool:
    """Whether `path` (`/` and what follows the model name, without the query) matches one pattern."""
    return any(pattern.search(path) for pattern in patterns)
