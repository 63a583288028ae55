"""`bench/whatif.py` judges each figure as its median over the seeds, so one chaotic run does not decide it."""

from bench import whatif
from bench.whatif import Figures, WhatIf


def figures(interactive_p50: float, swaps: int) -> Figures:
    waits = {band: (None, None) for band in whatif.prediction.BANDS}
    waits["interactive"] = (interactive_p50, 2 * interactive_p50)
    return Figures(waits, swaps)


def run(replayed: float, real: float, swaps: int) -> WhatIf:
    a = figures(1.0, 9)
    return WhatIf(30, a, a, figures(replayed, swaps), figures(real, swaps))


def test_each_figure_is_its_median_over_the_seeds_and_one_wild_seed_does_not_decide():
    runs = [run(2.0, 2.0, 10), run(3.0, 1.0, 12), run(2.2, 2.0, 11)]  # the second seed is off by 200 %
    median = whatif.median_of(runs)
    assert median.requests == 90
    assert median.replayed_b.waits["interactive"] == (2.2, 4.4) and median.real_b.waits["interactive"] == (2.0, 4.0)
    assert median.replayed_b.waits["batch"] == (None, None)  # no run had the figure: none to judge
    assert median.replayed_b.swaps == 11
    assert round(median.worst(), 2) == 0.1 and round(runs[1].worst(), 2) == 2.0
