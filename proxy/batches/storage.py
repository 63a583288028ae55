"""Where the Files API keeps file contents: `<LLAMASWAP_FILES_DIR>/<id>` (default `<data dir>/files`). A file
is written under a temporary name and renamed into place, so a reader (or a restart) never sees half of one."""

from __future__ import annotations

import os
import secrets
import time
from pathlib import Path

from django.conf import settings

CHUNK_BYTES = 1024 * 1024
# A file written under its temporary name and untouched this long was left by a process killed while writing it.
STALE_PARTIAL_S = 3600.0


def new_id(prefix: str) -> str:
    """An OpenAI-looking id: `file-…`, `batch_…`."""
    return prefix + secrets.token_hex(12)


def folder() -> Path:
    path = Path(settings.FILES_DIR)
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def path_of(file_id: str) -> Path:
    return folder() / file_id


def partial_path(file_id: str) -> Path:
    """Where a file is written until it is whole."""
    return folder() / f"{file_id}.partial"


def publish(file_id: str) -> None:
    """Make the written file visible under its id, durably."""
    partial = partial_path(file_id)
    with open(partial, "rb+") as written:
        os.fsync(written.fileno())
    os.replace(partial, path_of(file_id))


def remove(file_id: str) -> None:
    for path in (path_of(file_id), partial_path(file_id)):
        path.unlink(missing_ok=True)


def read_ranges(file_id: str, ranges: list[tuple[int, int]]) -> list[bytes]:
    """The bytes at each (offset, length) of the file, opened once."""
    found = []
    with open(path_of(file_id), "rb") as source:
        for offset, length in ranges:
            source.seek(offset)
            found.append(source.read(length))
    return found


def remove_stale_partials(older_than_s: float = STALE_PARTIAL_S) -> int:
    """Remove the temporary files nothing has written to for `older_than_s` (an upload or a batch's files cut short
    by a kill -9); how many. Only old ones: front ends sharing the folder may be writing theirs now."""
    cutoff, removed = time.time() - older_than_s, 0
    for path in folder().glob("*.partial"):
        try:
            if path.stat().st_mtime < cutoff:
                path.unlink()
                removed += 1
        except FileNotFoundError:  # another front end removed or published it meanwhile
            pass
    return removed
