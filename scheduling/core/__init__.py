"""The pure scheduling core: decisions only, no I/O, no clock, no event loop.

Time is always passed in; every call returns the effects the runtime must carry out.
"""

from .decision import Decision, ScoreTerms
from .effects import Dequeued, Effect, Grant, Refuse, StartModel, StopModel
from .fifo import FifoScheduler
from .fleet import ModelState
from .matrix import MatrixChoice, MatrixPolicy, MatrixSet, MatrixSyntaxError, compile_sets, parse_expression
from .priority import (BAND_SPACING, PRIORITY_ALIASES, PRIORITY_HEADER, Band, band_of, parse_priority,
                       readable_priority)
from .queue import Pick, WaitQueue
from .scheduler import SCHEDULERS, Scheduler, build_scheduler
from .serial import SerialScheduler
from .settings import MAX_SWAP_AFFINITY_BONUS, SerialSettings, SlotTable, serial_settings_problems
from .snapshot import SchedulerSnapshot
from .swap import DEFAULT_GROUP, SwapGroup, SwapPolicy
from .ticket import ModelSpec, Ticket

__all__ = [
    "BAND_SPACING",
    "DEFAULT_GROUP",
    "MAX_SWAP_AFFINITY_BONUS",
    "PRIORITY_ALIASES",
    "PRIORITY_HEADER",
    "SCHEDULERS",
    "Band",
    "Decision",
    "Dequeued",
    "Effect",
    "FifoScheduler",
    "Grant",
    "MatrixChoice",
    "MatrixPolicy",
    "MatrixSet",
    "MatrixSyntaxError",
    "ModelSpec",
    "ModelState",
    "Pick",
    "Refuse",
    "ScoreTerms",
    "Scheduler",
    "SchedulerSnapshot",
    "SerialScheduler",
    "SerialSettings",
    "SlotTable",
    "StartModel",
    "StopModel",
    "SwapGroup",
    "SwapPolicy",
    "Ticket",
    "WaitQueue",
    "band_of",
    "build_scheduler",
    "compile_sets",
    "parse_expression",
    "parse_priority",
    "readable_priority",
    "serial_settings_problems",
]
