"""Logging an outage once when it begins and once when it ends, not once per try.

A loop that retries a send or a receive every second while Redis is away would otherwise write a line
a second for as long as the outage lasts, and bury what else the log says.
"""

from __future__ import annotations

import logging
import time


class OutageLog:
    """For one repeated operation (`what`, e.g. "announcing this worker"): `failed` on each failed
    try, `worked` on each one that went through."""

    def __init__(self, log: logging.Logger, what: str) -> None:
        self._log = log
        self._what = what
        self._since: float | None = None  # when the tries began failing, while they do

    def failed(self, exc: BaseException) -> None:
        if self._since is None:
            self._since = time.monotonic()
            self._log.warning("%s failed (%s: %s); trying again until it works", self._what, type(exc).__name__, exc)

    def worked(self) -> None:
        if self._since is not None:
            self._log.warning("%s works again after %.1f s", self._what, time.monotonic() - self._since)
            self._since = None
