"""Named mutants of the scheduler and the quotas, each run against the tests that judge it to show they catch it.

A mutant is a set of exact source edits to one module of the repository, with the tests that judge that module.
Each is applied in memory only: a child process puts an import hook in front of the normal one that compiles
the edited source in place of the file, then runs pytest. The tree is never written. An edit whose text no
longer occurs exactly once fails loudly, so a refactor cannot quietly turn a mutant into the original code.

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
# The tests that judge each part, the property machines first, then the examples.
SERIAL = (
    "tests/core/test_serial_coexist_properties.py",
    "tests/core/test_serial_properties.py",
    "tests/core/test_queue.py",
    "tests/core/test_serial_slots.py",
    "tests/core/test_serial.py",
)
PLACEMENT = (
    "tests/core/test_placement_properties.py",
    "tests/core/test_placement.py",
    "tests/core/test_placement_reload.py",
    "tests/core/test_reconfigure.py",
    "tests/core/test_never_fits.py",
    "tests/core/test_measured_memory.py",
)
FAIRNESS = ("tests/core/test_fairness.py",)
QUOTAS = ("tests/keys/test_quota.py",)  # the Redis counter's tests need a Redis at 127.0.0.1:6379


@dataclass(frozen=True)
class Mutant:
    name: str
    module: str  # the file edited, from the repository's root
    edits: tuple[tuple[str, str], ...]  # (exact text, replacement), each text occurring once
    what: str
    tests: tuple[str, ...] = SERIAL  # the test files or ids that judge it

    @property
    def module_name(self) -> str:
        return self.module.removesuffix(".py").replace("/", ".")


MUTANTS = (
    Mutant(
        "drop-may-start-beside",
        "scheduling/core/serial.py",
        (("if not self._may_start_beside(model, target, up):", "if False:"),),
        "a start may stand in the way of a better request's reserved swap",
    ),
    Mutant(
        "walk-ends-after-first-grant",
        "scheduling/core/serial.py",
        (
            (
                "            following = self._waiting.queue.model_top(ticket.model, loaded, self._settings)",
                "            return False\n            following = None",
            ),
        ),
        "one call grants at most one request from the queue",
    ),
    Mutant(
        "no-walk-after-a-launch",
        "scheduling/core/serial.py",
        (("            if ticket.model not in loaded:\n                return True", "            if ticket.model not in loaded:\n                return False"),),
        "after launching a model, nothing else is dispatched in that call",
    ),
    Mutant(
        "ignore-promised-start-reservation",
        "scheduling/core/serial.py",
        (("if not launch.started:  # its evictions are promised", "if False:  # its evictions are promised"),),
        "a launch waiting for stops does not keep the models it will evict idle",
    ),
    Mutant(
        "swap-reserves-nothing",
        "scheduling/core/serial.py",
        (("            round_.reserve(ticket.id, model, victims | {model})\n", "            pass\n"),),
        "a swap waiting for busy models lets worse requests keep them busy",
    ),
    Mutant(
        "evict-busy-models",
        "scheduling/core/serial.py",
        (("busy = sorted(v for v in victims | {model} if self._in_use(v))", "busy = []"),),
        "a swap launches although the models it evicts still serve",
    ),
    Mutant(
        "one-slot-too-many",
        "scheduling/core/serial.py",
        (("return None if used < slots else", "return None if used <= slots else"),),
        "a model takes one job more than its slots",
    ),
    Mutant(
        "restart-a-model-being-stopped",
        "scheduling/core/serial.py",
        (("        return self._starts.stopped_for(model)", "        return None"),),
        "a model a start under way stops may start again before that start reports",
    ),
    Mutant(
        "ignore-aging",
        "scheduling/core/queue.py",
        (("key = ticket.arrival - ticket.priority * self._divisor", "key = -ticket.priority"),),
        "waiting longer never raises a request's rank",
    ),
    Mutant(
        "ignore-affinity",
        "scheduling/core/queue.py",
        (("affinity = bonus if self._tickets[entry[2]].model in loaded else 0", "affinity = 0"),),
        "a request for a loaded model gets no swap-affinity bonus in the ranking",
    ),
    Mutant(
        "reverse-priority",
        "scheduling/core/queue.py",
        (
            ("key = ticket.arrival - ticket.priority * self._divisor", "key = ticket.arrival + ticket.priority * self._divisor"),
            ("            key = -ticket.priority\n", "            key = ticket.priority\n"),
        ),
        "lower priority goes first",
    ),
    Mutant(
        "ties-to-the-later-arrival",
        "scheduling/core/queue.py",
        (("return (affinity - entry[0], -entry[1], -entry[2])", "return (affinity - entry[0], entry[1], -entry[2])"),),
        "among equal scores the later arrival goes first",
    ),
    Mutant(
        "demand-keeps-a-request-600-s-old",
        "scheduling/core/placement.py",
        (("while seen and seen[0][0] <= now - DEMAND_WINDOW_S:", "while seen and seen[0][0] < now - DEMAND_WINDOW_S:"),),
        "a request exactly 600 s old still counts in its model's demand",
        PLACEMENT,
    ),
    Mutant(
        "room-ignores-the-fewest-models",
        "scheduling/core/placement.py",
        (
            ("best[0], best[1] = (busy, cost, len(names), names), frozenset(names)",
             "best[0], best[1] = (busy, cost, 0, names), frozenset(names)"),
            ("(len(chosen), tuple(sorted(r.model for r in chosen))) < best[0][2:]",
             "(0, tuple(sorted(r.model for r in chosen))) < best[0][2:]"),
        ),
        "among sets of equal cost, more models may stop where fewer free the room",
        PLACEMENT,
    ),
    Mutant(
        "never-loaded-takes-the-default-load",
        "scheduling/core/memory_book.py",
        (("return sum(known) / len(known) if known else UNKNOWN_LOAD_S", "return UNKNOWN_LOAD_S"),),
        "a model never loaded counts 30 s, not the mean of the measured load times",
        PLACEMENT,
    ),
    Mutant(
        "lease-protects-at-its-end",
        "scheduling/core/memory_book.py",
        (("return lease is not None and (self._now if now is None else now) < lease[1]",
          "return lease is not None and (self._now if now is None else now) <= lease[1]"),),
        "a lease still protects its model at the instant it ends",
        PLACEMENT,
    ),
    Mutant(
        "reload-counts-a-stopping-victim",
        "scheduling/core/serial.py",
        (("holding = [m for m in self._fleet.not_stopped() if self._starts.stopped_for(m) is None]",
          "holding = self._fleet.not_stopped()"),),
        "a reload puts a model a start is stopping back in the memory book",
        PLACEMENT,
    ),
    Mutant(
        "fair-clock-stands-still",
        "scheduling/core/fairness.py",
        (("        group.clock = max(group.clock, turns.start)\n", "        pass\n"),),
        "fair share's virtual clock never moves, so a key arriving late takes its turns in a row",
        FAIRNESS,
    ),
    Mutant(
        "fair-start-ignores-the-clock",
        "scheduling/core/fairness.py",
        (("start = max(group.clock, group.ends.get(ticket.key, group.clock))",
          "start = group.ends.get(ticket.key, group.clock)"),),
        "a key back after being away banks the turns it missed",
        FAIRNESS,
    ),
    Mutant(
        "fair-share-charges-a-cancel",
        "scheduling/core/fairness.py",
        (("        group.ends[ticket.key] -= Fraction(1, ticket.weight)\n", ""),),
        "a request that leaves without its turn still costs its key one",
        FAIRNESS,
    ),
    Mutant(
        "give-back-frees-every-place",
        "scheduling/keys/quota.py",
        (("        if left > 0:\n", "        if False:\n"),),
        "a request giving back one of its key's places at once frees them all (in one process)",
        QUOTAS,
    ),
    Mutant(
        "redis-give-back-frees-every-place",
        "proxy/serving/quota_counters.py",
        (("redis.call('ZREM', KEYS[1], ARGV[1])", "redis.call('DEL', KEYS[1])"),),
        "a request giving back one of its key's places at once frees them all (in Redis)",
        QUOTAS,
    ),
    Mutant(
        "placeless-end-gives-back-a-place",
        "proxy/serving/quota_counters.py",
        (("        if place is not None:\n            self._windows.give_back(key)\n",
          "        self._windows.give_back(key)\n"),),
        "a request that held no place at once frees another request's when it ends",
        QUOTAS,
    ),
    Mutant(
        "newcomer-skips-the-keys-waiters",
        "proxy/serving/quota_gate.py",
        (("queued = here in _LINES and _LINES[here].waiting > 0", "queued = False"),),
        "a new request takes a freed place at once ahead of the key's requests waiting for it",
        QUOTAS,
    ),
    Mutant(
        "waiters-poll-for-a-place",
        "proxy/serving/quota_gate.py",
        (("await asyncio.wait_for(line.freed.wait(), RETRY_S)", "await asyncio.sleep(RETRY_S)"),),
        "a request waiting for a place at once asks again on a timer instead of waking when one frees",
        QUOTAS,
    ),
    Mutant(
        "redis-renewal-lets-a-place-lapse",
        "proxy/serving/quota_counters.py",
        (("pipe.zadd(places, {holder: lapse}, xx=True)", "pipe.zadd(places, {holder: lapse}, nx=True)"),),
        "a place held in Redis is not renewed, so it lapses under a request still running",
        QUOTAS,
    ),
    Mutant(
        "redis-renewal-lets-the-record-expire",
        "proxy/serving/quota_counters.py",
        (("                    for places in set(self._held.values()):\n"
          "                        pipe.expire(places, math.ceil(LEASE_S) + 1)\n", ""),),
        "the record of a key's places in Redis expires under a place still held and renewed",
        QUOTAS,
    ),
)


def mutated_source(mutant: Mutant) -> str:
    source = (ROOT / mutant.module).read_text()
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
    assert mutant.module_name not in sys.modules, f"{mutant.module_name} was imported before its mutant was installed"
    sys.meta_path.insert(0, _MutatedModule(mutant.module_name, ROOT / mutant.module, mutated_source(mutant)))
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


def judge(mutant: Mutant, tests: tuple[str, ...] | None = None) -> Verdict:
    """Run `tests` (None: the mutant's own) with `mutant` installed in a child process: which tests failed."""
    mutated_source(mutant)  # refuse a stale mutant before spending a run on it
    args = ["-q", "-p", "no:cacheprovider", "-p", "no:randomly", "-rf", "--no-header", *(tests or mutant.tests)]
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
    parser.add_argument("--tests", nargs="+", help="test files or ids to judge them with (default: each mutant's own)")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    options = parser.parse_args(argv)
    if options.list:
        for mutant in MUTANTS:
            print(f"{mutant.name}: {mutant.what}")
        return 0
    chosen = [by_name(n) for n in options.names] if options.names else list(MUTANTS)
    verdicts = []
    for mutant in chosen:
        verdicts.append(judge(mutant, tuple(options.tests) if options.tests else None))
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
