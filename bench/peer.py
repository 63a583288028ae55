"""LiteLLM's proxy as the peer: the same model behind another OpenAI-compatible proxy.

The benchmark installs LiteLLM into its own virtual environment, `.bench-venv/` (pip, from PyPI),
so it never enters llamaswap's dependencies, and starts `litellm --config` with one
`openai/<model>` entry whose `api_base` is the fake model that llamaswap also serves.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import MODEL, REPO  # noqa: E402
from tests.served import model_ports  # noqa: E402

VENV = REPO / ".bench-venv"
# Pinned: the newest release whose `proxy` extra resolves from PyPI (1.109 and later require
# litellm-proxy-extras or litellm-proxy releases that were not published there).
REQUIREMENT = "litellm[proxy]==1.108.7"
VERSION = REQUIREMENT.rsplit("==", 1)[1]
START_TIMEOUT_S = 120
INSTALL_TIMEOUT_S = 900


class PeerUnavailable(RuntimeError):
    """LiteLLM could not be installed or started; the message says why, for the report."""


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def installed_version() -> str | None:
    python = VENV / "bin" / "python"
    if not python.exists():
        return None
    probe = subprocess.run([python, "-c", "import importlib.metadata as m; print(m.version('litellm'))"],
                           capture_output=True, text=True)
    return probe.stdout.strip() if probe.returncode == 0 else None


def ensure_installed(log: Callable[[str], None] = print) -> str:
    """Create `.bench-venv/` and install the pinned LiteLLM unless it is already there; returns its version."""
    if installed_version() == VERSION:
        return VERSION
    if not (VENV / "bin" / "python").exists():
        log(f"creating {VENV.relative_to(REPO)}/ for LiteLLM")
        made = subprocess.run([sys.executable, "-m", "venv", VENV], capture_output=True, text=True)
        if made.returncode != 0:
            raise PeerUnavailable(f"`python -m venv {VENV}` failed: {_tail(made.stderr)}")
    log(f"installing {REQUIREMENT} into {VENV.relative_to(REPO)}/ (once; about a minute)")
    try:
        pip = subprocess.run([VENV / "bin" / "pip", "install", "--quiet", REQUIREMENT],
                             capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise PeerUnavailable(f"`pip install {REQUIREMENT}` took longer than {INSTALL_TIMEOUT_S} s") from None
    if pip.returncode != 0:
        errors = "\n".join(line for line in pip.stderr.splitlines() if not line.startswith("WARNING"))
        raise PeerUnavailable(f"`pip install {REQUIREMENT}` failed: {_tail(errors)}")
    return VERSION


def config_text(model_base: str) -> str:
    """One model, OpenAI-compatible, at the fake model's address. No master key: llamaswap runs
    without API keys here too, and LiteLLM refuses to start keyless unless told it is local."""
    return yaml.safe_dump({
        "model_list": [{"model_name": MODEL, "litellm_params": {
            "model": f"openai/{MODEL}", "api_base": model_base + "/v1", "api_key": "unused",
        }}],
        "general_settings": {"dangerously_permit_weak_or_unset_master_key": True},
    }, sort_keys=False)


@contextmanager
def litellm_proxy(model_base: str, tmp: Path) -> Iterator[str]:
    """Run LiteLLM's proxy in front of `model_base` on a free loopback port; yields its base URL."""
    config = tmp / "litellm.yaml"
    config.write_text(config_text(model_base))
    port = model_ports(1)  # below the ephemeral range, where outgoing connections cannot take it
    log_path = tmp / "litellm.log"
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}  # no download of the price list at start
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [VENV / "bin" / "litellm", "--config", config, "--host", "127.0.0.1", "--port", str(port)],
            stdout=log, stderr=subprocess.STDOUT, env=env, cwd=tmp, start_new_session=True,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _alive(base):
            if process.poll() is not None:
                raise PeerUnavailable(f"litellm exited with {process.returncode} at start:\n"
                                      f"{_tail(log_path.read_text(errors='replace'))}")
            if time.monotonic() > deadline:
                raise PeerUnavailable(f"litellm did not answer /health/liveliness within {START_TIMEOUT_S} s")
            time.sleep(0.2)
        yield base
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(5)


def _alive(base: str) -> bool:
    try:
        return httpx.get(base + "/health/liveliness", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False
