"""What llamaswap build is running: for `GET /api/version` and `llamaswap --version`."""

from __future__ import annotations

import functools
import importlib.metadata
import subprocess
from pathlib import Path

UNKNOWN = "unknown"
_SOURCE = Path(__file__).resolve().parent.parent


def llamaswap_version() -> str:
    """The installed package's version (pyproject.toml's `version`)."""
    try:
        return importlib.metadata.version("llamaswap")
    except importlib.metadata.PackageNotFoundError:
        return UNKNOWN


@functools.cache
def build_info() -> dict[str, str]:
    """llama-swap's build fields: version, commit and build date. A Python package is not built into a
    binary, so the commit and its date come from the source checkout when there is one ("unknown" if not)."""
    commit, date = UNKNOWN, UNKNOWN
    if (_SOURCE / ".git").exists():
        try:
            found = subprocess.run(
                ["git", "-C", str(_SOURCE), "log", "-1", "--format=%h %cI"],
                capture_output=True, text=True, timeout=5, check=True,
            ).stdout.split()
        except (OSError, subprocess.SubprocessError):
            found = []
        if len(found) == 2:
            commit, date = found
    return {"version": llamaswap_version(), "commit": commit, "build_date": date}
