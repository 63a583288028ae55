"""A full disk, for real: a small tmpfs mounted for the test holds the service's files folder
(`LLAMASWAP_FILES_DIR`) and its temporary files (`TMPDIR`, where the HTTP server and Django spool request bodies),
and a filler file takes its room. Wherever the disk fills under an upload — as the body arrives, as the application
reads it, as the file is written — the upload is answered 507 `disk_full`, OpenAI-shaped, nothing of it is kept
(no `.partial`, no row, no space held), the service serves on, and the same upload succeeds once space is freed.
A batch whose output cannot be written waits in `finalizing`, its results kept, and completes once space frees."""

from __future__ import annotations

import errno
import os
import shutil
import sqlite3
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.e2e.test_batches import client, config, jsonl, lines_of
from tests.reliability.support import chat
from tests.served import Served, wait_until

pytestmark = pytest.mark.e2e
DISK_BYTES = 16 * 1024 * 1024
INODES = 1000
FILE_LIMIT = 8_000_000  # maxBatchFileBytes: room for the 3 MB upload


class SmallDisk:
    """A tmpfs of `DISK_BYTES` and `INODES` files mounted at `root`, and what fills it: a file that takes all of its
    room but `leave` bytes, or empty files that take every inode."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.filler = root / "filler"
        self.inodes = root / "inodes"

    def free(self) -> int:
        stat = os.statvfs(self.root)
        return stat.f_bavail * stat.f_frsize

    def used(self) -> int:
        stat = os.statvfs(self.root)
        return (stat.f_blocks - stat.f_bfree) * stat.f_frsize

    def fill(self, leave: int = 0) -> None:
        """Take the room but `leave` bytes (0: every byte, written until the disk says it is full)."""
        with open(self.filler, "ab") as filler:
            try:
                while (room := self.free() - leave) > 0:
                    filler.write(b"\0" * min(room, 1 << 20))
                    filler.flush()
            except OSError as exc:
                assert leave == 0, exc
        assert self.free() <= leave + 4096, (self.free(), leave)

    def take_every_inode(self) -> None:
        """Leave the room but no file to be created: empty files until the disk says it is full."""
        self.inodes.mkdir(exist_ok=True)
        try:
            for n in range(INODES):
                (self.inodes / str(n)).touch()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
        else:
            raise AssertionError(f"{INODES} files created on a disk of {INODES} inodes")

    def empty(self) -> None:
        self.filler.unlink(missing_ok=True)
        if self.inodes.exists():
            shutil.rmtree(self.inodes)


@pytest.fixture(scope="module")
def small_disk(tmp_path_factory):
    root = tmp_path_factory.mktemp("full-disk") / "disk"
    root.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK_BYTES},nr_inodes={INODES},mode=0700", "tmpfs", str(root)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs (needs root with CAP_SYS_ADMIN): {mounted.stderr.strip()}")
    try:
        (root / "files").mkdir()
        (root / "tmp").mkdir()
        yield SmallDisk(root)
    finally:
        subprocess.run(["umount", "--lazy", str(root)], check=True)


@pytest.fixture(scope="module")
def served(tmp_path_factory, small_disk):
    tmp = tmp_path_factory.mktemp("full-disk-service")
    text = config(tmp / "events.jsonl").replace("maxBatchFileBytes: 2000000", f"maxBatchFileBytes: {FILE_LIMIT}")
    env = {"LLAMASWAP_FILES_DIR": str(small_disk.root / "files"), "TMPDIR": str(small_disk.root / "tmp")}
    with Served(tmp, text, env=env) as started:
        # Python picks the folder of its temporary files at their first use, the first of TMPDIR, /tmp… it can create
        # a file in: one upload spooled now, while the disk has room, makes it TMPDIR for the service's life.
        assert upload(started, sized(200_000)).status_code == 200
        yield started


@pytest.fixture
def disk(small_disk):
    yield small_disk
    small_disk.empty()


def file_rows(served: Served) -> list[str]:
    with sqlite3.connect(f"file:{served.data_dir / 'llamaswap.sqlite3'}?mode=ro", uri=True, timeout=5) as con:
        return [row[0] for row in con.execute("SELECT id FROM scheduling_batchfile ORDER BY id")]


def upload(served: Served, content: bytes) -> httpx.Response:
    return httpx.post(served.base + "/v1/files", data={"purpose": "batch"}, files={"file": ("in.jsonl", content)},
                      timeout=60)


def sized(size: int) -> bytes:
    """A valid batch input file of about `size` bytes."""
    one = jsonl(1)
    return jsonl(size // len(one))


# Where the disk fills: (the file's size, how the disk is filled). Under 100 000 bytes the server keeps a body in
# memory and Django too (under 2.5 MB), so the file's own writing fills it; 1 MB with 256 KiB left fills it as the
# server spools the body, and with no inode left as the server creates its spool file; 3 MB with 4 MiB left lets
# the server spool it and fills it as Django copies it past 2.5 MB.
WHERE = {
    "writing the file": (90_000, lambda disk: disk.fill(leave=16 * 1024)),
    "spooling the body as it arrives": (1_000_000, lambda disk: disk.fill(leave=256 * 1024)),
    "creating the spool file": (1_000_000, SmallDisk.take_every_inode),
    "reading the body into the application": (3_000_000, lambda disk: disk.fill(leave=4 * 1024 * 1024)),
}


@pytest.mark.parametrize("where", WHERE)
def test_an_upload_that_finds_the_disk_full_is_507_keeps_nothing_and_succeeds_once_space_frees(served, disk, where):
    size, fill = WHERE[where]
    content = sized(size)
    kept_files, kept_rows = sorted(os.listdir(disk.root / "files")), file_rows(served)
    fill(disk)
    filled = disk.used()

    refused = upload(served, content)

    assert refused.status_code == 507, (refused.status_code, refused.text[:500])
    assert refused.headers["content-type"] == "application/json"
    error = refused.json()["error"]
    assert (error["type"], error["code"]) == ("server_error", "disk_full"), error
    assert "disk is full" in error["message"] and str(disk.root) not in error["message"], error
    assert sorted(os.listdir(disk.root / "files")) == kept_files  # no .partial, nothing published
    assert file_rows(served) == kept_rows
    assert sorted(entry["id"] for entry in httpx.get(served.base + "/v1/files", timeout=10).json()["data"]) == kept_rows
    # Nothing written for it holds the disk's room: no temporary file left open.
    wait_until(lambda: disk.used() <= filled, 10, 0.05, "the upload's temporary files to give their room back")
    assert chat(served.base, "chat").status_code == 200  # the service serves on

    disk.empty()
    stored = upload(served, content)
    assert stored.status_code == 200, stored.text
    assert stored.json()["bytes"] == len(content)
    assert httpx.get(served.base + f"/v1/files/{stored.json()['id']}/content", timeout=30).content == content
    assert [name for name in os.listdir(disk.root / "files") if name.endswith(".partial")] == []


def test_a_batch_whose_output_finds_the_disk_full_waits_in_finalizing_and_completes_once_space_frees(served, disk):
    api = client(served)
    uploaded = api.files.create(file=("in.jsonl", jsonl(3)), purpose="batch")
    disk.fill()
    batch = api.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")

    # The runner tried to write the output, found the disk full and logged it; it tries again 1 s later at the soonest.
    wait_until(lambda: any(batch.id in line and "No space left on device" in line
                           for line in served.log().splitlines()), 30, 0.02, "the runner to find the disk full")
    assert [name for name in os.listdir(disk.root / "files") if name.endswith(".partial")] == []
    waiting = api.batches.retrieve(batch.id)
    assert waiting.status == "finalizing" and waiting.output_file_id is None, waiting
    assert waiting.request_counts.model_dump() == {"total": 3, "completed": 3, "failed": 0}
    assert chat(served.base, "chat").status_code == 200  # the service serves on

    disk.empty()
    done = wait_until(lambda: (b := api.batches.retrieve(batch.id)).status != "finalizing" and b, 90, 0.1,
                      "the batch to complete once space freed")
    assert done.status == "completed", done
    assert [line["custom_id"] for line in lines_of(api, done.output_file_id)] == [f"line-{n}" for n in range(3)]
    assert [name for name in os.listdir(disk.root / "files") if name.endswith(".partial")] == []


def test_a_model_request_whose_body_the_server_cannot_spool_is_507_and_served_once_space_frees(served, disk):
    body = {"model": "chat", "messages": [{"role": "user", "content": "x" * 1_000_000}]}
    disk.fill(leave=256 * 1024)
    refused = httpx.post(served.base + "/v1/chat/completions", json=body, timeout=60)
    assert refused.status_code == 507, (refused.status_code, refused.text[:500])
    assert refused.json()["error"]["code"] == "disk_full"
    assert chat(served.base, "chat").status_code == 200  # a small body is kept in memory: served

    disk.empty()
    assert httpx.post(served.base + "/v1/chat/completions", json=body, timeout=60).status_code == 200


def test_an_upload_whose_row_finds_the_databases_disk_full_is_507_and_keeps_no_file(tmp_path, disk):
    """The default layout keeps SQLite in the data dir: here it alone is on the full disk, so the file is written
    and put in place, and recording it fails. The file goes with the refusal; the request rows wait and are written
    once space frees."""
    data = disk.root / "data-of-a-second-service"
    env = {"LLAMASWAP_DATA_DIR": str(data), "LLAMASWAP_FILES_DIR": str(tmp_path / "files")}
    with Served(tmp_path, config(tmp_path / "events.jsonl"), env=env) as second:
        second.data_dir = data
        disk.fill()
        refused = upload(second, jsonl(2))
        assert refused.status_code == 507, (refused.status_code, refused.text[:500])
        error = refused.json()["error"]
        assert (error["type"], error["code"]) == ("server_error", "disk_full") and "disk is full" in error["message"]
        assert os.listdir(tmp_path / "files") == []
        assert chat(second.base, "chat").status_code == 200  # its row waits for room

        disk.empty()
        stored = upload(second, jsonl(2))
        assert stored.status_code == 200, stored.text
        assert os.listdir(tmp_path / "files") == [stored.json()["id"]]
        second.check_settled("chat")
