"""`logToStdout` and `logTimeFormat` applied: which stream carries llamaswap's own log lines, how
their time reads, and whether the models' output is copied to stdout (see proxy/config/log_output.py).

Applied at start and again on every reload, so a changed key takes effect without a restart.
"""

from __future__ import annotations

import logging
import sys
from datetime import datetime

from proxy.config.log_output import TIME_LAYOUTS, LogOutput

_copy_model_output = False
_default_formats: dict[logging.Handler, logging.Formatter | None] = {}


class LayoutFormatter(logging.Formatter):
    """`<time> LEVEL logger: message`, the time in one of Go's layouts (none for `""`), in local time."""

    def __init__(self, layout: str):
        super().__init__("%(levelname)s %(name)s: %(message)s")
        self.layout = TIME_LAYOUTS.get(layout)

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        if self.layout is None:
            return line
        return f"{self.layout(datetime.fromtimestamp(record.created).astimezone())} {line}"


def apply_log_output(output: LogOutput) -> None:
    global _copy_model_output
    _copy_model_output = output.model_output_on_stdout
    for handler in logging.getLogger("llamaswap").handlers:
        if not isinstance(handler, logging.StreamHandler) or handler.stream not in (sys.stdout, sys.stderr):
            continue
        default = _default_formats.setdefault(handler, handler.formatter)
        handler.setStream(sys.stdout if output.own_lines_on_stdout else sys.stderr)
        handler.setFormatter(default if output.time_format is None else LayoutFormatter(output.time_format))


def copy_model_output(chunk: bytes) -> None:
    """A model server's output, written to stdout as it came when logToStdout is upstream or both."""
    if _copy_model_output:
        sys.stdout.flush()  # text written before (a log line) goes out first
        sys.stdout.buffer.write(chunk)
        sys.stdout.buffer.flush()
