"""`bench/suite.py --only PART --write FILE` replaces what those parts wrote before, and nothing else; every figure
on the benchmarks page is one it wrote."""

import re

from bench import suite


def report_of(part: str, measured: str, title: str) -> suite.Report:
    report = suite.Report(running=part)
    report.judge(f"{part} figure", "p50", "≤ 9 s", measured, True)
    report.figure(f"{part} figure without a target", measured)
    report.section(title, "| a |\n|--:|", f"| {measured} |")
    return report


def whole_run(*reports: suite.Report) -> str:
    combined = suite.Report()
    for report in reports:
        combined.targets += report.targets
        combined.figures += report.figures
        combined.sections += report.sections
    return suite.render(combined, "suite --write", "0.1 0.1 0.1", 60, "none")


def test_a_part_run_again_replaces_its_rows_and_sections_and_keeps_the_others():
    before = whole_run(report_of("data-path", "1 ms", "Data path"), report_of("replay", "2 ms", "Replay"))
    after = suite.splice(before, report_of("replay", "3 ms", "Replay again"), ["replay"], "suite --only replay", "1")
    assert "2 ms" not in after and "#### Replay\n" not in after
    assert after.count("3 ms") == 3 and "#### Replay again" in after
    assert after.count("1 ms") == 3 and "#### Data path" in after  # the other part's rows and section stay
    assert "- replay run again by `suite --only replay`" in after
    assert "(load average before: 1, after: " in after  # the load it ran at, not only the load it began at
    again = suite.splice(after, report_of("replay", "4 ms", "Replay"), ["replay"], "suite --only replay", "1")
    assert "3 ms" not in again and again.count("4 ms") == 3 and again.count("run again") == 1


def test_a_part_never_written_before_is_added():
    before = whole_run(report_of("data-path", "1 ms", "Data path"))
    after = suite.splice(before, report_of("replay-what-if", "5 ms", "What-if"), ["replay-what-if"], "x", "1")
    assert after.count("5 ms") == 3 and after.count("1 ms") == 3
    assert after.index("| replay-what-if figure |") < after.index("| data-path figure without")


def test_the_suite_starts_as_make_bench_runs_it_without_django_set_up():
    """Under pytest Django is set up before any import, so a bench module that needs it at import time would pass
    here and break `make bench` before its first part; a process of its own, as the Makefile starts it, shows it."""
    import os
    import subprocess
    import sys

    env = {name: value for name, value in os.environ.items() if name != "DJANGO_SETTINGS_MODULE"}
    started = subprocess.run([sys.executable, str(suite.REPO / "bench" / "suite.py"), "--help"], cwd=suite.REPO,
                             env=env, capture_output=True, text=True, timeout=120)
    assert started.returncode == 0, started.stderr
    assert "--only" in started.stdout


def test_outside_the_generated_results_the_benchmarks_page_has_no_figures_typed_from_a_run():
    """A figure typed from a run goes stale as the code changes and cannot be rerun: outside the results markers the
    page holds prose and commands, no table and no dated run."""
    head, _, tail = suite.results_of(suite.REPO / "BENCHMARKS.md")
    outside = re.sub(r"```.*?```", "", head + tail, flags=re.S)
    assert [line for line in outside.splitlines() if re.fullmatch(r"\|.*\|\s*", line)] == []  # a table's row
    assert re.findall(r"\b20\d\d-\d\d-\d\d\b", outside) == []
