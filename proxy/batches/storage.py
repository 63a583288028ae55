"""Where the Files API keeps file contents: `<LLAMASWAP_FILES_DIR>/<id>` (default `<data dir>/files`). A file
is written under a temporary name and renamed into place, so a reader (or a restart) never sees half of one."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from django.conf import settings

CHUNK_BYTES = 1024 * 1024


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


def read_range(file_id: str, offset: int, length: int) -> bytes:
    with open(path_of(file_id), "rb") as source:
        source.seek(offset)
        return source.read(length)
