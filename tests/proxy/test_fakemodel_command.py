"""`llamaswap fakemodel` run by hand: the stand-in model server leaves the directory it runs in untouched."""

from __future__ import annotations

import os
import selectors
import subprocess
import sys
from pathlib import Path

import httpx

REPO_ROOT = Path(__file__).resolve().parents[2]
DEADLINE_S = 15.0


def llamaswap_command() -> list[str]:
    """The installed console script when there is one, else the same entry point through the interpreter."""
    script = Path(sys.executable).with_name("llamaswap")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "import sys; from llamaswap_site.manage import main; main(sys.argv)"]


def test_llamaswap_fakemodel_creates_no_data_dir_and_no_secret_key(tmp_path):
    env = {key: value for key, value in os.environ.items() if not key.startswith(("LLAMASWAP_", "DJANGO_"))}
    process = subprocess.Popen(
        [*llamaswap_command(), "fakemodel", "--port", "0", "--model", "by-hand"],
        cwd=tmp_path, env={**env, "PYTHONPATH": str(REPO_ROOT)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    try:
        with selectors.DefaultSelector() as selector:
            selector.register(process.stdout, selectors.EVENT_READ)
            assert selector.select(timeout=DEADLINE_S), process.stderr.read1().decode(errors="replace")
        address = process.stdout.readline().decode().rsplit(" ", 1)[-1].strip()
        models = httpx.get(f"http://{address}/v1/models", timeout=DEADLINE_S).json()
        assert [entry["id"] for entry in models["data"]] == ["by-hand"]
    finally:
        process.terminate()
        process.wait(DEADLINE_S)
        process.stdout.close()
        process.stderr.close()
    assert sorted(path.name for path in tmp_path.iterdir()) == []
