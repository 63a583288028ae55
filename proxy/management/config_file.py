"""What `llamaswap serve` and `llamaswap worker` share: the config file named on the command line."""

from __future__ import annotations

import os
import sys

from django.conf import settings


def read_config(command, path: str, summary: bool = True):
    """Load and check `path`, print its summary (unless `summary` is False: output a script reads) and
    warnings; exit 2 with the problems if it is unusable."""
    from proxy.config import ConfigError, load_config

    path = os.path.abspath(path)
    try:
        config = load_config(path)
    except ConfigError as exc:
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


def serve_config_from(path: str) -> None:
    """Make `path` the config this process serves (reloads and pages read it from there)."""
    path = os.path.abspath(path)
    settings.LLAMASWAP_CONFIG = path
    os.environ["LLAMASWAP_CONFIG"] = path
