"""Named mutants of the scheduling core, each run against the core's tests to show they catch it.

A mutant is a set of exact source edits to one module of `scheduling/core`. Each is applied in
memory only: a child process puts an import hook in front of the normal one that compiles the
edited source in place of the file, then runs pytest. The tree is never written. An edit whose
text no longer occurs exactly once fails loudly, so a refactor cannot quietly turn a mutant
into the original code.

    .venv/bin/python -m tests.core.mutants            # every mutant, a table, exit 1 if any survives
    .venv/bin/python -m tests.core.mutants NAME ...   # only these

Hypothesis runs derandomized, with the full example counts (as under CI), without shrinking and
without its example database, so a run is reproducible and a caught mutant costs only the time to
its first failure. The table it prints, with the date and the command, is what docs/testing.md quotes.
"""

from __future__ import annotations

import argparse
import importlib.abc
import importlib.util
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CORE = ROOT / "scheduling" / "core"
# The tests that judge the serial scheduler: the property machines first, then the examples.
TESTS = (
    "tests/core/test_serial_coexist_properties.py",
    "tests/core/test_serial_properties.py",
    "tests/core/test_queue.py",
    "tests/core/test_serial_slots.py",
    "tests/core/test_serial.py",
)


@dataclass(frozen=True)
class Mutant:
    name: str
    module: str  # file under scheduling/core
    edits: tuple[tuple[str, str], ...]  # (exact text, replacement), each text occurring once
    what: str


MUTANTS = (
    Mutant(
        "drop-may-start-beside",
        "serial.py",
        (("if not self._may_start_beside(model, target, up):", "if False:"),),
        "a start may stand in the way of a better request's reserved swap",
    ),
    Mutant(
        "walk-ends-after-first-grant",
        "serial.py",
        (
            (
                "            following = self._queue.model_top(ticket.model, loaded, self._settings)",
                "            return False\n            following = None",
            ),
        ),
        "one call grants at most one request from the queue",
    ),
    Mutant(
        "no-walk-after-a-launch",
        "serial.py",
        (("            if ticket.model not in loaded:\n                return True", "            if ticket.model not in loaded:\n                return False"),),
        "after launching a model, nothing else is dispatched in that call",
    ),
    Mutant(
        "ignore-promised-start-reservation",
        "serial.py",
        (("if not launch.started:  # its evictions are promised", "if False:  # its evictions are promised"),),
        "a launch waiting for stops does not keep the models it will evict idle",
    ),
    Mutant(
        "swap-reserves-nothing",
        "serial.py",
        (("            round_.reserve(ticket.id, model, victims | {model})\n", "            pass\n"),),
        "a swap waiting for busy models lets worse requests keep them busy",
    ),
    Mutant(
        "evict-busy-models",
        "serial.py",
        (("busy = sorted(v for v in victims | {model} if self._in_use(v))", "busy = []"),),
        "a swap launches although the models it evicts still serve",
    ),
    Mutant(
        "one-slot-too-many",
        "serial.py",
        (("return None if used < slots else", "return None if used <= slots else"),),
        "a model takes one job more than its slots",
    ),
    Mutant(
        "restart-a-model-being-stopped",
        "serial.py",
        (("        return self._evicting.get(model)", "        return None"),),
        "a model a start under way stops may start again before that start reports",
    ),
    Mutant(
        "ignore-aging",
        "queue.py",
        (("key = ticket.arrival - ticket.priority * self._divisor", "key = -ticket.priority"),),
        "waiting longer never raises a request's rank",
    ),
    Mutant(
        "ignore-affinity",
        "queue.py",
        (("affinity = bonus if self._tickets[entry[2]].model in loaded else 0", "affinity = 0"),),
        "a request for a loaded model gets no swap-affinity bonus in the ranking",
    ),
    Mutant(
        "reverse-priority",
        "queue.py",
        (
            ("key = ticket.arrival - ticket.priority * self._divisor", "key = ticket.arrival + ticket.priority * self._divisor"),
            ("            key = -ticket.priority\n", "            key = ticket.priority\n"),
        ),
        "lower priority goes first",
    ),
    Mutant(
        "ties-to-the-later-arrival",
        "queue.py",
        (("return (affinity - entry[0], -entry[1], -entry[2])", "return (affinity - entry[0], entry[1], -entry[2])"),),
        "among equal scores the later arrival goes first",
    ),
)


def mutated_source(mutant: Mutant) -> str:
    source = (CORE / mutant.module).read_text()
    for old, new in mutant.edits:
        count = source.count(old)
        if count != 1:
            raise SystemExit(f"mutant {mutant.name}: {old!r} occurs {count} times in {mutant.module}, not once")
        source = source.replace(old, new)
    return source


class _MutatedModule(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves one module's edited source in place of its file."""

    def __init__(self, fullname: str, path: Path, source: str) -> None:
        self.fullname, self.path, self.source = fullname, path, source

    def find_spec(self, fullname, path, target=None):
        if fullname != self.fullname:
            return None
        return importlib.util.spec_from_file_location(fullname, self.path, loader=self)

    def create_module(self, spec):
        return None

    def exec_module(self, module) -> None:
        exec(compile(self.source, str(self.path), "exec"), module.__dict__)


def run_one(name: str, pytest_args: list[str]) -> int:
    """In the child: install the mutant, then run pytest."""
    import pytest
    from hypothesis import Phase, settings

    mutant = by_name(name)
    assert "scheduling" not in sys.modules, "the core was imported before its mutant was installed"
    sys.meta_path.insert(0, _MutatedModule(f"scheduling.core.{mutant.module[:-3]}", CORE / mutant.module, mutated_source(mutant)))
    settings.register_profile("mutant", derandomize=True, database=None, phases=(Phase.explicit, Phase.generate))
    settings.load_profile("mutant")
    return pytest.main(pytest_args)


def by_name(name: str) -> Mutant:
    for mutant in MUTANTS:
        if mutant.name == name:
            return mutant
    raise SystemExit(f"no mutant named {name!r}; known: {', '.join(m.name for m in MUTANTS)}")


@dataclass(frozen=True)
class Verdict:
    mutant: Mutant
    failed: tuple[str, ...]  # test ids that failed under it
    seconds: float

    @property
    def caught(self) -> bool:
        return bool(self.failed)


def judge(mutant: Mutant, tests: tuple[str, ...]) -> Verdict:
    """Run `tests` with `mutant` installed in a child process: which tests failed."""
    mutated_source(mutant)  # refuse a stale mutant before spending a run on it
    args = ["-q", "-p", "no:cacheprovider", "-p", "no:randomly", "-rf", "--no-header", *tests]
    started = time.monotonic()
    child = subprocess.run(
        [sys.executable, "-m", "tests.core.mutants", "--run-one", mutant.name, "--", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "LLAMASWAP_FULL_SEARCH": "1"},
    )
    seconds = time.monotonic() - started
    failed = tuple(dict.fromkeys(re.findall(r"^FAILED (\S+)", child.stdout, re.MULTILINE)))
    if child.returncode not in (0, 1) or (child.returncode == 1) != bool(failed):
        raise SystemExit(f"mutant {mutant.name}: pytest exited {child.returncode}\n{child.stdout[-3000:]}{child.stderr[-3000:]}")
    return Verdict(mutant, failed, seconds)


def short(test_id: str) -> str:
    path, _, name = test_id.partition("::")
    return f"{Path(path).stem}::{name.removesuffix('::runTest')}"


def table(verdicts: list[Verdict]) -> str:
    lines = ["| mutant | what it breaks | caught by | tests failed | s |", "|---|---|---|---|---|"]
    for v in verdicts:
        caught = short(v.failed[0]) if v.caught else "**SURVIVED**"
        lines.append(f"| `{v.mutant.name}` | {v.mutant.what} | {caught} | {len(v.failed)} | {v.seconds:.0f} |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--run-one"]:
        name, rest = argv[1], argv[2:]
        return run_one(name, rest[1:] if rest[:1] == ["--"] else rest)
    parser = argparse.ArgumentParser(prog="python -m tests.core.mutants", description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="mutants to run (default: all)")
    parser.add_argument("--tests", nargs="+", default=list(TESTS), help="test files or ids to judge them with")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    options = parser.parse_args(argv)
    if options.list:
        for mutant in MUTANTS:
            print(f"{mutant.name}: {mutant.what}")
        return 0
    chosen = [by_name(n) for n in options.names] if options.names else list(MUTANTS)
    verdicts = []
    for mutant in chosen:
        verdicts.append(judge(mutant, tuple(options.tests)))
        print(f"{mutant.name}: {'caught by ' + short(verdicts[-1].failed[0]) if verdicts[-1].caught else 'SURVIVED'}", file=sys.stderr)
    survivors = [v.mutant.name for v in verdicts if not v.caught]
    command = " ".join([".venv/bin/python -m tests.core.mutants", *argv])
    seconds = sum(v.seconds for v in verdicts)
    print(f"`{command}`, {time.strftime('%Y-%m-%d', time.gmtime())}, {seconds:.0f} s: "
          f"{len(verdicts) - len(survivors)} of {len(verdicts)} mutants caught"
          + (f"; survived: {', '.join(survivors)}" if survivors else "") + ".\n")
    print(table(verdicts))
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
