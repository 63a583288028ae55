"""Layers point one way: `proxy` (HTTP, model processes, config) may use `scheduling`, never the
reverse, so the scheduler can run in a process that serves no HTTP at all."""

from pathlib import Path

import pytest

from .test_purity import imported_modules

SCHEDULING = Path(__file__).resolve().parents[2] / "scheduling"
MODULES = sorted(p for p in SCHEDULING.rglob("*.py") if "migrations" not in p.parts)


def package_of(path: Path) -> str:
    """The dotted package a module's relative imports resolve against."""
    return ".".join(path.relative_to(SCHEDULING.parent).with_suffix("").parts[:-1])


def reaches_into_proxy(source: str, package: str) -> list[str]:
    return [name for name in imported_modules(source, package) if name == "proxy" or name.startswith("proxy.")]


def test_there_are_scheduling_modules_to_scan():
    assert {p.name for p in MODULES} >= {"runtime.py", "admin.py", "metrics.py", "frontdoor.py", "serial.py"}


@pytest.mark.parametrize("module", MODULES, ids=lambda p: str(p.relative_to(SCHEDULING)))
def test_scheduling_never_imports_proxy(module):
    assert reaches_into_proxy(module.read_text(), package_of(module)) == []


@pytest.mark.parametrize(
    "source",
    ["import proxy", "from proxy.service import current_service", "from proxy import views",
     "def f():\n    from proxy.config import ConfigError\n"],
)
def test_the_scan_sees_every_way_of_importing_proxy(source):
    assert reaches_into_proxy(source, "scheduling")


@pytest.mark.parametrize("source", ["from scheduling.core import Ticket", "from . import frontdoor", "import proxyish"])
def test_the_scan_lets_other_imports_be(source):
    assert reaches_into_proxy(source, "scheduling") == []
