"""What `llamaswap serve` and `llamaswap worker` share: the config file named on the command line."""

from __future__ import annotations

import os
import sys

from django.conf import settings


def read_config(command, path: str | None, summary: bool = True, config_dir: str | None = None):
    """Load and check `path` (and the files of `config_dir`, merged after it), print its summary (unless
    `summary` is False: output a script reads) and warnings; exit 2 with the problems if it is unusable."""
    from proxy.config import ConfigError, load_config

    path = os.path.abspath(path) if path else None
    try:
        config = load_config(path, config_dir)
    except ConfigError as exc:
        for warning in exc.warnings:
            command.stderr.write(f"warning: {warning}")
        command.stderr.write(str(exc))
        sys.exit(2)
    except OSError as exc:
        command.stderr.write(f"{path}: cannot read the config file: {exc.strerror}")
        sys.exit(2)
    for warning in config.warnings:
        command.stderr.write(f"warning: {warning}")
    if summary:
        command.stdout.write(config.describe())
    return config


def serve_config_from(path: str | None, config_dir: str | None = None) -> None:
    """Make `path` (and `config_dir`) the config this process serves (reloads and pages read it from there)."""
    path = os.path.abspath(path) if path else ""
    config_dir = os.path.abspath(config_dir) if config_dir else ""
    settings.LLAMASWAP_CONFIG = path
    os.environ["LLAMASWAP_CONFIG"] = path
    settings.LLAMASWAP_CONFIG_DIR = config_dir
    os.environ["LLAMASWAP_CONFIG_DIR"] = config_dir
