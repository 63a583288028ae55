"""The config file's `logLevel`, applied to llamaswap's own loggers (the `llamaswap` tree)."""

from __future__ import annotations

import logging

LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warn": logging.WARNING, "error": logging.ERROR}


def apply_log_level(level: str) -> None:
    """Set at start and again on every reload, so a changed `logLevel` takes effect without a restart."""
    logging.getLogger("llamaswap").setLevel(LEVELS[level])
