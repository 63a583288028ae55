"""Replay's what-if against reality: traffic recorded under settings A, replayed under B, and run for
real under B.

    .venv/bin/python bench/whatif.py [--seconds 45] [--seeds 21 22 ... 29]

One workload (`bench/prediction.py`'s steady shape: Poisson arrivals, three bands, two fake models in
one swap group, so swaps) is sent to a real `llamaswap serve` twice, at the same moments: once with
settings A (`swapAffinityBonus: 0`, strict priority-then-arrival order, a swap at each change of
model), once with B (`swapAffinityBonus: 10`, the default). `llamaswap replay --set
swapAffinityBonus=10` on A's recording says what B would do; B's own run says what it did. Each
figure (wait p50 and p99 by band, from arrival to being sent to the model; model starts) is reported
for the four: A recorded, A replayed (the replay's fidelity), B replayed, B for real, with the
replayed B's difference from the real B. Each figure is the median over several seeds (workloads) of
that seed's figure: a band's p50 in one 45 s run is that of about ten requests, and which model is up
when each arrives (so every later swap) turns on a few milliseconds of the real service's timing, so
one seed's figures swing by a third or more between two runs of the same traffic.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import prediction  # noqa: E402
from bench.common import REPO, load_average, machine  # noqa: E402
from scheduling.core.replay import waits  # noqa: E402
from tests.e2e.conftest import db_rows  # noqa: E402
from tests.reliability.support import all_rows_terminal  # noqa: E402
from tests.served import Served, fake_cmd, model_ports  # noqa: E402

SETTING = "swapAffinityBonus"
A, B = 0, 10
SEEDS = tuple(range(21, 30))  # the workloads each figure's median is taken over (an odd count)
TARGET = 0.2  # |replayed B − real B| ÷ real B, each figure
# The floor a difference is judged against: a wait shorter than this (a short stream's wait for what is
# left of a job) is within the noise of a shared 2-CPU machine, so its relative difference says little.
FLOOR_S = 0.5


def config_text(bonus: int) -> str:
    config = yaml.safe_load(prediction.config_text())
    config["routing"]["scheduler"]["settings"] = {"serial": {SETTING: bonus}}
    return yaml.safe_dump(config, sort_keys=False)


@dataclass(frozen=True)
class Figures:
    """wait p50 and p99 by band (seconds) and model starts."""

    waits: dict[str, tuple[float | None, float | None]]
    swaps: int


def from_rows(rows: list[dict]) -> Figures:
    by_band: dict[str, list[float]] = {band: [] for band in prediction.BANDS}
    for row in rows:
        if row["dispatched_at"] is not None:
            waited = datetime.fromisoformat(row["dispatched_at"]) - datetime.fromisoformat(row["arrived_at"])
            by_band[row["band"]].append(waited.total_seconds())
    found = {band: waits(values) for band, values in by_band.items()}
    return Figures({band: (w.p50, w.p99) for band, w in found.items()},
                   sum(1 for row in rows if row["needed_swap"]))


def from_replay(run: dict) -> Figures:
    return Figures({band: (run["waits"][band]["p50"], run["waits"][band]["p99"]) for band in prediction.BANDS},
                   run["swaps"])


@dataclass(frozen=True)
class WhatIf:
    requests: int
    recorded_a: Figures
    replayed_a: Figures
    replayed_b: Figures
    real_b: Figures

    def differences(self) -> list[tuple[str, float | None, float | None, float | None]]:
        """(figure, replayed B, real B, relative difference or None where real B is under the floor)."""
        out = []
        for band in prediction.BANDS:
            for n, name in enumerate(("p50", "p99")):
                replayed, real = self.replayed_b.waits[band][n], self.real_b.waits[band][n]
                out.append((f"{band} wait {name} s", replayed, real, _relative(replayed, real, FLOOR_S)))
        out.append(("model starts", self.replayed_b.swaps, self.real_b.swaps,
                    _relative(self.replayed_b.swaps, self.real_b.swaps, 1)))
        return out

    def worst(self) -> float:
        return max((d for *_, d in self.differences() if d is not None), default=0.0)


def median_of(runs: list[WhatIf]) -> WhatIf:
    """Each figure of each of the four as the median over `runs` (an odd count keeps each one a figure
    some run had); requests summed."""
    def figures(which: str) -> Figures:
        each = [getattr(run, which) for run in runs]
        waits = {band: tuple(_median([f.waits[band][n] for f in each]) for n in (0, 1)) for band in prediction.BANDS}
        return Figures(waits, statistics.median_low(f.swaps for f in each))

    return WhatIf(sum(run.requests for run in runs), *(figures(which) for which in
                                                       ("recorded_a", "replayed_a", "replayed_b", "real_b")))


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def _relative(replayed: float | None, real: float | None, floor: float) -> float | None:
    if replayed is None or real is None or real < floor:
        return None
    return abs(replayed - real) / real


def run_workload(bonus: int, jobs: list[prediction.Job], tmp: Path) -> tuple[Served, list[dict]]:
    served = Served(tmp, config_text(bonus))
    with served:
        asyncio.run(prediction.send_all(served, jobs))
        rows = all_rows_terminal(served.data_dir, len(jobs), timeout=60)
    return served, rows


def replayed(served: Served) -> dict:
    out = subprocess.run(
        [sys.executable, str(REPO / "manage.py"), "replay", "--config", str(served.config_path),
         "--since", "2000-01-01T00:00+00:00", "--json", "--set", f"{SETTING}={B}"],
        cwd=REPO, env=served.env, capture_output=True, text=True, check=True,
    )
    return json.loads(out.stdout)


def measure(seconds: float, seed: int = 21) -> WhatIf:
    jobs = prediction.workload(seconds, seed, "steady")
    with tempfile.TemporaryDirectory(prefix="llamaswap-bench-") as a, \
            tempfile.TemporaryDirectory(prefix="llamaswap-bench-") as b:
        served_a, rows_a = run_workload(A, jobs, Path(a))
        played = replayed(served_a)
        _, rows_b = run_workload(B, jobs, Path(b))
    return WhatIf(len(jobs), from_rows(rows_a), from_replay(played["in_force"]), from_replay(played["proposed"]),
                  from_rows(rows_b))


def over_seeds(seconds: float, seeds: tuple[int, ...] = SEEDS) -> tuple[WhatIf, list[WhatIf]]:
    """Each seed's workload measured in turn (never side by side: they would slow each other's service);
    the medians, and each seed's own."""
    runs = [measure(seconds, seed) for seed in seeds]
    return median_of(runs), runs


def _cell(value: float | int | None) -> str:
    if value is None:
        return "—"
    return str(value) if isinstance(value, int) else f"{value:.2f}"


HEADER = (f"| figure | A ({SETTING} {A}) recorded | A replayed | B ({SETTING} {B}) replayed from A's recording "
          "| B for real | \\|replayed − real\\| ÷ real |\n|---|--:|--:|--:|--:|--:|")


def rows(result: WhatIf) -> list[str]:
    lines = []
    differences = {name: d for name, *_, d in result.differences()}
    for band in prediction.BANDS:
        for n, name in enumerate(("p50", "p99")):
            figure = f"{band} wait {name} s"
            d = differences[figure]
            lines.append(f"| {figure} | {_cell(result.recorded_a.waits[band][n])} "
                         f"| {_cell(result.replayed_a.waits[band][n])} | {_cell(result.replayed_b.waits[band][n])} "
                         f"| {_cell(result.real_b.waits[band][n])} "
                         f"| {'— (under %g s)' % FLOOR_S if d is None else f'{d:.0%}'} |")
    d = differences["model starts"]
    lines.append(f"| model starts | {result.recorded_a.swaps} | {result.replayed_a.swaps} | {result.replayed_b.swaps} "
                 f"| {result.real_b.swaps} | {'—' if d is None else f'{d:.0%}'} |")
    return lines


def method(seconds: float, seeds: tuple[int, ...], runs: list[WhatIf]) -> str:
    each = ", ".join(f"{seed}: {run.worst():.0%}" for seed, run in zip(seeds, runs, strict=True))
    return (" ".join(__doc__.split("\n\n", 2)[2].split()) + f" {seconds:g} s of arrivals a seed, seeds "
            f"{', '.join(map(str, seeds))}; p99 is the nearest rank (with under 100 requests in a band, its longest "
            f"wait); model starts' median is the lower middle one; a difference is judged only where the real figure "
            f"is at least {FLOOR_S:g} s (one start for model starts). Each seed's own largest difference: {each}.")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=45, help="how long requests keep arriving")
    parser.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    args = parser.parse_args(argv)
    load_before = load_average()
    seeds = tuple(args.seeds)
    result, runs = over_seeds(args.seconds, seeds)
    print(f"machine: {machine()}")
    print(f"load average (1/5/15 min) before: {load_before}, after: {load_average()}")
    print(f"command: .venv/bin/python bench/whatif.py --seconds {args.seconds:g} --seeds {' '.join(map(str, seeds))}\n")
    print(method(args.seconds, seeds, runs) + "\n")
    print(HEADER)
    print("\n".join(rows(result)))
    print(f"\nworst difference: {result.worst():.0%} (target ≤ {TARGET:.0%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
