"""Rules for the whole suite.

Under `CI=true` a skipped test fails. Locally a test may skip when the machine lacks something it
needs (Chromium, promtool, PostgreSQL, the llama-swap compat corpus, the real llama.cpp extra) and
says why; on CI such a skip would mean the setup is broken while the run stays green. One hook
covers every test, including skips declared by markers or raised at import time.
"""

from __future__ import annotations

import os

import pytest


def skips_fail() -> bool:
    return os.environ.get("CI", "").strip().lower() == "true"


def skip_reason(report) -> str:
    """The reason pytest recorded for a skip (its long representation is (path, line, reason))."""
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return reason.removeprefix("Skipped: ")


def fail_the_skip(report) -> None:
    report.outcome = "failed"
    report.longrepr = f"skipped under CI=true, where every test must run: {skip_reason(report)}"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if skips_fail() and report.skipped and not hasattr(report, "wasxfail"):
        fail_the_skip(report)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
    report = yield
    if skips_fail() and report.skipped:
        fail_the_skip(report)
    return report
