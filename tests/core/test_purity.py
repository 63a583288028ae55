"""scheduling/core stays pure: standard library only, no framework, no event loop, no threads, no clock."""

import ast
import sys
from pathlib import Path

import pytest

CORE = Path(__file__).resolve().parents[2] / "scheduling" / "core"
CORE_PACKAGE = "scheduling.core"
# Frameworks and I/O belong to the runtime; time is passed in, never read.
FORBIDDEN = {
    "asyncio", "channels", "concurrent", "daphne", "datetime", "django", "httpx",
    "multiprocessing", "_thread", "threading", "time",
}


def parsed(source: str, tries: int = 5) -> ast.Module:
    """`ast.parse(source)`, tried again when Python 3.11.7's AST builder reports "recursion depth mismatch": its
    depth counter is shared by every thread, so another thread building an AST at the same moment (3.11 parses a
    line of source to underline it in every traceback it formats, as a test's server thread logging an error
    does) upsets it. The source is not at fault, and the next try is unhurried."""
    for _ in range(tries - 1):
        try:
            return ast.parse(source)
        except SystemError as exc:
            if "recursion depth mismatch" not in str(exc):
                raise
    return ast.parse(source)


def imported_modules(source: str, package: str = CORE_PACKAGE) -> list[str]:
    """Absolute names of every module a source file imports (relative imports resolved)."""
    names = []
    for node in ast.walk(parsed(source)):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                names.append(f"{base}.{node.module}" if node.module else base)
            else:
                names.append(node.module)
    return names


def violations(source: str) -> list[str]:
    problems = []
    for name in imported_modules(source):
        top = name.split(".")[0]
        if name == CORE_PACKAGE or name.startswith(CORE_PACKAGE + "."):
            continue
        if top in FORBIDDEN:
            problems.append(f"{name}: forbidden in the core")
        elif top not in sys.stdlib_module_names:
            problems.append(f"{name}: not in the standard library")
    return problems


CORE_MODULES = sorted(CORE.glob("*.py"))


def test_the_core_has_modules_to_scan():
    assert {p.name for p in CORE_MODULES} >= {"priority.py", "queue.py", "serial.py", "fifo.py"}


@pytest.mark.parametrize("module", CORE_MODULES, ids=lambda p: p.name)
def test_core_module_imports_only_the_standard_library(module):
    assert violations(module.read_text()) == []


@pytest.mark.parametrize(
    "source",
    [
        "import asyncio",
        "import time",
        "from time import monotonic",
        "import threading",
        "from django.conf import settings",
        "import channels.layers",
        "import httpx",
        "import daphne",
        "import yaml",
        "from scheduling.runtime import SchedulerRuntime",
        "from .. import runtime",
        "def f():\n    import asyncio\n",
    ],
)
def test_scanner_flags_forbidden_imports(source):
    assert violations(source)


@pytest.mark.parametrize(
    "source",
    ["import heapq", "from dataclasses import dataclass", "from . import queue", "from .queue import WaitQueue",
     "from scheduling.core.ticket import Ticket", "import collections.abc"],
)
def test_scanner_allows_the_stdlib_and_the_core_itself(source):
    assert violations(source) == []
