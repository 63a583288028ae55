"""From the `cmd` text in the config to an argv list.

The text is written for humans: whole-line `#` comments document flags, and
a trailing backslash continues a line as in a shell. No shell runs it, so
only POSIX quoting applies — no pipes, globs or variables.
"""

from __future__ import annotations

import shlex


def strip_comment_lines(text: str) -> str:
    """Drop lines whose first non-blank character is `#` (done before macro expansion)."""
    return "\n".join(line for line in text.split("\n") if not line.lstrip().startswith("#"))


def split_command(text: str) -> tuple[str, ...]:
    """Split a command into argv; raises ValueError with a readable reason.

    A line ending in a backslash joins the next line; then the whole text is
    split with POSIX shell quoting rules.
    """
    lines = []
    for line in strip_comment_lines(text).split("\n"):
        stripped = line.rstrip()
        lines.append(stripped[:-1] + " " if stripped.endswith("\\") else line)
    try:
        return tuple(shlex.split("\n".join(lines), comments=False, posix=True))
    except ValueError as exc:
        raise ValueError(f"{str(exc).lower()} — close every quote you open, or escape it with a backslash") from None
