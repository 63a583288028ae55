"""Every benchmark in one run, side by side, written into BENCHMARKS.md.

    .venv/bin/python bench/suite.py [--quick] [--no-peer] [--only PART ...] [--write BENCHMARKS.md]

Runs, in order: the scheduling core; added latency, first SSE chunk and streaming throughput
through llamaswap against straight to the model, alternating, and the serial dispatch gap; the
same requests again with LiteLLM's proxy (the peer, installed into `.bench-venv/` on first use)
in the rotation, all three in front of one fake model; interactive wait under batch saturation
(serial, then fifo); swap thrash (swapAffinityBonus 10, then 0); the wait prediction's error (each
waiting request's predicted wait against its actual one, three bands, two models swapping); the replay
of recorded traffic (requests replayed per second, fidelity to a recorded run); memory placement against
hand-written groups, judged over five traces, and one placement decision's cost; models
that coexist and models with several slots (embeddings beside a batch job, concurrent streams on
slots, service CPU per streamed chunk); llama-swap parity (a chat relayed to a peer beside one through the
scheduler, a WebSocket message through the passthrough, captures on against off, llama-swap's activity API on a
million rows); queue capacity; and distributed mode beside one process
(grant and dispatch gap over Redis, added latency through a front end, throughput through one and
two front ends; skipped, saying why, without PostgreSQL and Redis); and the latency API key quotas add per
request, counted in the process and in Redis; and the Batch API (added cost per line against a client sending the
same requests, the service's peak memory at 10 000 and 50 000 lines). The targets for llamaswap alone
are judged on the first data-path run, with no third server on the machine.
Prints one markdown report and, with `--write`, replaces the text between that file's results
markers with it; the report says how long the run took (the first run also installs LiteLLM).

A part that fails is reported as failed (its traceback on stderr) and the rest still runs; the
exit status is then 1. `--quick` runs every part at a smaller size. `--only`
runs the parts named (e.g. `--only distributed-mode`) and prints their report; `--baseline COMMIT` adds the part
data-path-a-b (that commit's tree served beside this one, alternating: `bench/proxy.py --baseline`); with `--write` it
replaces only what those parts wrote before (their summary rows and sections, found by the marks
each carries) and says under the heading when they were run again.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import (batches, distributed, interactive, key_quotas, llama_swap_parity, load, peer, placement,  # noqa: E402
                   prediction, prediction_core, proxy, replay, scheduler_core, slots, streaming, thrash, whatif)
from bench.common import REPO, Stats, added, direct_base, load_average, machine, stats, versions  # noqa: E402

BEGIN = "<!-- bench:results -->"
END = "<!-- /bench:results -->"
PEER_RATIO_TARGET = 0.5


@dataclass(frozen=True)
class Sizes:
    requests: int  # rounds of tiny chat requests
    streams: int  # rounds of first-chunk streams
    jobs: int  # queued jobs for the dispatch gap
    stream_tokens: int
    stream_rounds: int
    peer_stream_rounds: int  # a LiteLLM stream of 20 000 chunks takes seconds
    batch_jobs: int
    batch_job_seconds: float
    interactive_every: float
    thrash_requests: int
    thrash_load_delay: float
    capacity_clients: int
    capacity_models: int
    embeddings: int  # embeddings requests a side, idle and beside a batch job
    embeddings_blocks: int  # alternating idle and busy blocks they are split into
    single_slot_rounds: int  # embeddings requests behind a job in one swap group
    slot_rounds: int  # rounds of concurrent streams on slots, and of CPU per chunk
    cpu_tokens: int  # tokens a stream for CPU per chunk
    throughput_requests: int  # tiny chats a distributed-mode throughput run
    throughput_rounds: int
    prediction_seconds: float  # how long the wait prediction's workload keeps arriving
    replay_rows: int  # synthetic recorded requests the replay's speed is measured on
    replay_seconds: float  # how long the recorded run the replay's fidelity is measured on keeps arriving
    ws_messages: int  # rounds of 100-byte WebSocket messages
    ws_bulk_messages: int  # rounds of 1 MiB WebSocket messages
    capture_streams: int  # rounds of 2000-token streams with and without captures
    activity_rows: int  # ended rows llama-swap's activity API reads


# Queue capacity drains through one model: with several in one swap group the drain is bound by the
# swaps (one whenever the next request's model differs), which swap thrash measures, not the queue.
FULL = Sizes(300, 100, 200, 20_000, 5, 3, 50, 1.0, 3.0, 30, 0.2, 2_000, 1, 200, 4, 5, 2, 10_000, 300, 3, 60,
             100_000, 60, 1_000, 20, 10, 1_000_000)
QUICK = Sizes(100, 30, 50, 20_000, 2, 1, 10, 1.0, 1.5, 16, 0.2, 500, 1, 100, 2, 3, 1, 5_000, 150, 2, 25,
              100_000, 20, 300, 5, 3, 100_000)


@dataclass(frozen=True)
class Target:
    """One summary row: a target, named by exactly the statistic its verdict judges, and that
    statistic as measured."""

    what: str  # what was measured, with its sample size
    statistic: str
    bound: str
    measured: str
    verdict: str
    part: str = ""  # the part that measured it, hyphenated


@dataclass
class Report:
    """The targets and the figures without one (what, value, part), then the detail sections (part,
    text), in run order."""

    targets: list[Target] = field(default_factory=list)
    figures: list[tuple[str, str, str]] = field(default_factory=list)
    sections: list[tuple[str, str]] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    running: str = ""  # the part running now, hyphenated

    def part(self, name: str, run: Callable[[], None]) -> None:
        """Run one part; a failure is recorded against its name instead of ending the suite."""
        print(f"[bench] {name} …", file=sys.stderr, flush=True)
        self.running = hyphenated(name)
        started = time.monotonic()
        try:
            run()
        except Exception as exc:  # noqa: BLE001 - every failure is reported, with its traceback
            traceback.print_exc()
            self.failed.append(name)
            reason = f"{type(exc).__name__}: {exc}".replace("|", "\\|").replace("\n", " ")[:300]
            self.targets.append(Target(name, "—", "—", f"**failed**: {reason}", "FAILED", self.running))
        print(f"[bench] {name}: {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)

    def judge(self, what: str, statistic: str, bound: str, measured: str, ok: bool) -> None:
        self.targets.append(Target(what, statistic, bound, measured, met(ok), self.running))

    def not_measured(self, what: str, statistic: str, bound: str, why: str) -> None:
        self.targets.append(Target(what, statistic, bound, f"not measured: {why}", "not measured", self.running))

    def figure(self, what: str, value: str) -> None:
        """A figure worth a glance that no target judges."""
        self.figures.append((what, value, self.running))

    def section(self, title: str, *blocks: list[str] | str) -> None:
        body = "\n\n".join(block if isinstance(block, str) else "\n".join(block) for block in blocks)
        self.sections.append((self.running, f"#### {title}\n\n{body}"))


def met(ok: bool) -> str:
    return "met" if ok else "**MISSED**"


def hyphenated(name: str) -> str:
    """A part's name as `--only` takes it."""
    return name.replace(" ", "-")


# -- the parts ---------------------------------------------------------------------------------

def core_part(report: Report) -> None:
    costs = [scheduler_core.measure(size) for size in scheduler_core.SIZES]
    at_target = next(c for c in costs if c.waiting == scheduler_core.TARGET_WAITING)
    what = f"scheduling decision, core only, {scheduler_core.TARGET_WAITING:,} waiting"
    report.judge(what, "dispatch p50", f"≤ {scheduler_core.TARGET_US:g} µs", f"{at_target.dispatch.p50:.1f} µs",
                 at_target.dispatch.p50 <= scheduler_core.TARGET_US)
    report.figure(f"{what}: dispatch p99", f"{at_target.dispatch.p99:.1f} µs")
    report.section("Scheduling core (µs per operation)",
                   [scheduler_core.HEADER, *map(scheduler_core.row, costs)])


def data_path_part(report: Report, sizes: Sizes) -> None:
    """Added latency, first chunk and streaming, llamaswap against the model itself; then the dispatch gap."""
    with tempfile.TemporaryDirectory(prefix="llamaswap-bench-") as tmp:
        with proxy.served_model(Path(tmp)) as (served, events), httpx.Client(timeout=300) as client:
            targets = {"direct": direct_base(served.base), "llamaswap": served.base}
            overhead = proxy.measure_overhead(client, targets, sizes.requests, sizes.streams)
            runs = streaming.measure_streams(client, targets, sizes.stream_tokens, sizes.stream_rounds)
            gaps = proxy.dispatch_gaps_ms(served, events, sizes.jobs)
            floor = proxy.floor_gaps_ms(targets["direct"], events, sizes.jobs)

    chat_added = stats(added(overhead.chat["llamaswap"], overhead.chat["direct"]))
    first_added = stats(added(overhead.first_chunk["llamaswap"], overhead.first_chunk["direct"]))
    gap, floor_gap = stats(gaps), stats(floor)
    ratio = streaming.ratio_to_direct(runs, "llamaswap")
    judge_ms(report, f"dispatch gap between serial jobs, {sizes.jobs} jobs", "", gap, proxy.TARGETS_MS["dispatch gap"])
    report.figure(f"dispatch gap floor: one client straight to the model, {sizes.jobs} jobs",
                  f"p50 {floor_gap.p50:.2f} ms, p99 {floor_gap.p99:.2f} ms")
    judge_ms(report, f"added latency, tiny chat, {sizes.requests} rounds", "added ", chat_added,
             proxy.TARGETS_MS["added latency"])
    judge_ms(report, f"time to first token, {sizes.streams} rounds", "added ", first_added,
             proxy.TARGETS_MS["first chunk added"])
    report.figure(f"time to first token, {sizes.streams} rounds: added p99", f"{first_added.p99:+.2f} ms")
    report.judge(f"streaming throughput, {sizes.stream_tokens:,} chunks, {sizes.stream_rounds} rounds",
                 "p50 of per-round ratios to direct", f"≥ {streaming.TARGET_RATIO:g}", f"{ratio:.2f}",
                 ratio >= streaming.TARGET_RATIO)
    report.section(
        "Data path: llamaswap against the model itself (ms unless stated)",
        proxy.overhead_table(f"chat, non-streaming, {sizes.requests} rounds", overhead.chat),
        proxy.overhead_table(f"first SSE chunk, {sizes.streams} rounds", overhead.first_chunk),
        streaming.stream_table(runs, sizes.stream_tokens),
        proxy.gap_table(gaps, floor),
    )


def data_path_ab_part(report: Report, sizes: Sizes, baseline: str) -> None:
    """The data path's added latency and dispatch gap, a baseline commit beside this tree in one alternating run."""
    with tempfile.TemporaryDirectory(prefix="llamaswap-bench-") as tmp:
        ab = proxy.measure_ab(Path(tmp), baseline, sizes.requests, sizes.streams, sizes.jobs)
    chat_base, chat_now = (stats(ab.added(ab.overhead.chat, side)).p50 for side in ("baseline", "llamaswap"))
    ratio_base, ratio_now = (stats(ab.gaps[side]).p50 / stats(ab.floors[side]).p50 for side in ("baseline", "llamaswap"))
    what = f"against baseline `{ab.rev}` in one alternating run"
    report.judge(f"added latency, tiny chat, {sizes.requests} rounds, {what}", "added p50",
                 f"≤ {proxy.AB_TARGETS['added p50 ms']:g} ms",
                 f"+{chat_now:.2f} ms (baseline +{chat_base:.2f} ms)", chat_now <= proxy.AB_TARGETS["added p50 ms"])
    report.judge(f"dispatch gap between serial jobs, {sizes.jobs} jobs, {what}", "gap p50 ÷ floor p50 (same side)",
                 f"≤ {proxy.AB_TARGETS['gap p50 ÷ floor p50']:g}",
                 f"{ratio_now:.2f} (baseline {ratio_base:.2f})",
                 ratio_now <= proxy.AB_TARGETS["gap p50 ÷ floor p50"])
    report.section(f"Data path A/B: this tree against `{ab.rev}`, each with its own fake model (ms unless stated)",
                   proxy.ab_table(ab))


def judge_ms(report: Report, what: str, prefix: str, measured: Stats, bounds: tuple[float, float | None]) -> None:
    """One row per bound: the p50 and, where there is one, the p99 (`prefix`: "added " for added latency)."""
    signed = "+" if prefix else ""
    for name, value, bound in (("p50", measured.p50, bounds[0]), ("p99", measured.p99, bounds[1])):
        if bound is not None:
            report.judge(what, prefix + name, f"≤ {bound:g} ms", f"{value:{signed}.2f} ms", value <= bound)


def peer_part(report: Report, sizes: Sizes, with_peer: bool) -> None:
    """The same requests through LiteLLM's proxy, in one rotation with llamaswap and the model itself."""
    what = f"added latency beside LiteLLM's proxy, one rotation, {sizes.requests} rounds"
    statistic = "llamaswap's added p50 ÷ LiteLLM's added p50"
    bound = f"≤ {PEER_RATIO_TARGET:g}"
    if not with_peer:
        report.not_measured(what, statistic, bound, "`--no-peer`")
        return
    try:
        peer.ensure_installed(lambda line: print(f"[bench] {line}", file=sys.stderr, flush=True))
    except peer.PeerUnavailable as exc:
        report.not_measured(what, statistic, bound, str(exc))
        return
    with tempfile.TemporaryDirectory(prefix="llamaswap-bench-") as tmp:
        with proxy.served_model(Path(tmp)) as (served, _), httpx.Client(timeout=300) as client:
            direct = direct_base(served.base)
            with peer.litellm_proxy(direct, Path(tmp)) as litellm:
                targets = {"direct": direct, "llamaswap": served.base, "LiteLLM": litellm}
                overhead = proxy.measure_overhead(client, targets, sizes.requests, sizes.streams)
                runs = streaming.measure_streams(client, targets, sizes.stream_tokens, sizes.peer_stream_rounds)

    ours = stats(added(overhead.chat["llamaswap"], overhead.chat["direct"]))
    theirs = stats(added(overhead.chat["LiteLLM"], overhead.chat["direct"]))
    share = ours.p50 / theirs.p50
    report.judge(what, statistic, bound, f"{share:.2f} ({ours.p50:+.2f} ms ÷ {theirs.p50:+.2f} ms)",
                 share <= PEER_RATIO_TARGET)
    report.figure(f"streaming through LiteLLM, {sizes.stream_tokens:,} chunks, {sizes.peer_stream_rounds} rounds",
                  f"{streaming.ratio_to_direct(runs, 'LiteLLM'):.2f} of direct "
                  f"(llamaswap {streaming.ratio_to_direct(runs, 'llamaswap'):.2f} in the same rotation)")
    report.section(
        f"Peer: LiteLLM {peer.VERSION} in front of the same model, measured in one rotation with llamaswap",
        proxy.overhead_table(f"chat, non-streaming, {sizes.requests} rounds", overhead.chat),
        proxy.overhead_table(f"first SSE chunk, {sizes.streams} rounds", overhead.first_chunk),
        streaming.stream_table(runs, sizes.stream_tokens),
    )


def interactive_part(report: Report, sizes: Sizes) -> None:
    results = [interactive.measure(scheduler, sizes.batch_jobs, sizes.batch_job_seconds, sizes.interactive_every)
               for scheduler in interactive.SCHEDULERS]
    serial, fifo = results
    limit_ms = interactive.target_s(sizes.batch_job_seconds) * 1000
    def what(result: interactive.Saturation) -> str:
        return (f"interactive wait behind {sizes.batch_job_seconds:g} s batch jobs, {result.scheduler}, "
                f"{result.wait.n} interactive requests")

    report.judge(what(serial), "p99 wait at the client",
                 f"≤ {limit_ms:,.0f} ms (one job + {interactive.SLACK_S * 1000:g} ms)",
                 f"{serial.wait.p99:,.0f} ms", serial.wait.p99 <= limit_ms)
    report.figure(what(fifo), f"p99 wait at the client {fifo.wait.p99:,.0f} ms")
    report.section(
        f"Interactive wait: {sizes.batch_jobs} batch jobs of {sizes.batch_job_seconds:g} s, "
        f"an interactive request every {sizes.interactive_every:g} s",
        [interactive.HEADER, *interactive.rows(results, sizes.batch_job_seconds)],
    )


def thrash_part(report: Report, sizes: Sizes) -> None:
    models = thrash.sequence(sizes.thrash_requests)
    results = [thrash.measure(bonus, models, sizes.thrash_load_delay) for bonus in thrash.BONUSES]
    report.figure(f"swap thrash, {len(models)} requests over 3 models",
                  "; ".join(f"swapAffinityBonus {r.bonus}: {r.swaps} swaps, drained in {r.drain_s:.1f} s"
                            for r in results))
    report.section(
        f"Swap thrash: {len(models)} equal-priority requests over 3 models in one swap group, "
        f"load delay {sizes.thrash_load_delay:g} s",
        f"Arrival order: `{''.join(models)}` ({thrash.changes(models)} model changes).",
        [thrash.HEADER, *thrash.rows(results)],
    )


def prediction_part(report: Report, sizes: Sizes) -> None:
    """Each waiting request's predicted wait, first seen at its enqueue, against its actual wait."""
    run = prediction.measure(sizes.prediction_seconds)
    result = prediction.overall(run)
    what = (f"predicted wait at enqueue, mixed workload (3 bands, 2 models swapping), {result.counted} of "
            f"{len(run.samples)} requests that waited")
    report.judge(what, "median of \\|predicted − actual\\| ÷ actual", f"≤ {prediction.TARGET_MEDIAN:.0%}",
                 f"{result.median:.0%}", result.median <= prediction.TARGET_MEDIAN)
    rest = "—" if result.median_not_overtaken is None else f"{result.median_not_overtaken:.0%}"
    report.figure(f"{what}: p90; median of the {result.not_overtaken} that no later arrival overtook",
                  f"{result.p90:.0%}; {rest}")
    report.section(
        f"Wait prediction: {len(run.samples)} requests over {sizes.prediction_seconds:g} s, 3 bands, "
        f"2 models in one swap group",
        prediction.method(run),
        [prediction.HEADER, *prediction.rows(run)],
    )


def replay_part(report: Report, sizes: Sizes) -> None:
    """Requests replayed per second, and a replay with the settings in force against a recorded run."""
    speed = replay.measure_speed(sizes.replay_rows)
    what = f"replay of recorded traffic, core only, {speed.rows:,} requests"
    report.judge(what, "requests replayed per second", f"≥ {replay.TARGET_PER_S:,}", f"{speed.per_s:,.0f}",
                 speed.per_s >= replay.TARGET_PER_S)
    report.figure(f"the same {speed.rows:,} requests read from SQLite as the replay reads them",
                  f"{speed.read_s:.2f} s")
    result = replay.measure_fidelity(sizes.replay_seconds)
    measured = result.plain["fidelity"]
    same = "—" if measured["same_order"] is None else f"{measured['same_order']:.1%}"
    error = "—" if measured["wait_error_s"] is None else f"{measured['wait_error_s'] * 1000:.0f} ms"
    report.figure(f"replay with the settings in force against a recorded run of {result.requests} requests: pairs "
                  "that waited together sent in the same order; median \\|wait error\\|", f"{same}; {error}")
    report.section(
        f"Replay: speed at {speed.rows:,} requests, fidelity on a recorded run of {sizes.replay_seconds:g} s",
        replay.method(),
        replay.speed_rows(speed),
        replay.fidelity_rows(result),
    )


def prediction_seeds_part(report: Report, quick: bool) -> None:
    """The forecast on the core alone: four workload shapes, tuned and unseen seeds."""
    seconds = 150 if quick else 300
    results = prediction_core.judge_all(seconds)
    for r in results:
        if r.seeds == "unseen":
            overall, batch = r.median(), r.median("batch")
            report.judge(f"predicted wait, core alone, {r.shape}, unseen seeds {prediction.JUDGED_SEEDS}",
                         "median of \\|predicted − actual\\| ÷ actual: all; batch",
                         f"≤ {prediction.TARGET_MEDIAN:.0%}; ≤ {prediction.TARGET_BATCH_MEDIAN:.0%}",
                         f"{overall:.0%}; {batch:.0%}",
                         overall <= prediction.TARGET_MEDIAN and batch <= prediction.TARGET_BATCH_MEDIAN)
    costs = {waiting: prediction_core.forecast_cost_ms(waiting) for waiting in prediction_core.COST_WAITING}
    report.figure("one forecast of the whole queue (what `/api/queue` pays at most once a second), core alone, "
                  f"median of {prediction_core.COST_CALLS} calls",
                  ", ".join(f"{waiting:,} waiting {ms:,.0f} ms" for waiting, ms in costs.items()))
    report.section("Wait prediction over seeds and workload shapes (core alone)", prediction_core.method(seconds),
                   [prediction_core.HEADER, *prediction_core.rows(results)])


def whatif_part(report: Report, quick: bool) -> None:
    """Replay's what-if held against the same traffic run for real under the proposed settings."""
    seconds, seeds = (20, whatif.SEEDS[:1]) if quick else (45, whatif.SEEDS)
    result, runs = whatif.over_seeds(seconds, seeds)
    report.judge(f"replay's what-if ({whatif.SETTING} {whatif.A} → {whatif.B}), {result.requests} requests over "
                 f"{len(seeds)} seeds", "largest \\|replayed − real\\| ÷ real over the seeds' median wait p50/p99 "
                 "by band and model starts", f"≤ {whatif.TARGET:.0%}", f"{result.worst():.0%}",
                 result.worst() <= whatif.TARGET)
    report.section(f"Replay's what-if against reality: {result.requests} requests, {len(seeds)} seeds of {seconds:g} s",
                   whatif.method(seconds, seeds, runs), [whatif.HEADER, *whatif.rows(result)])


def placement_part(report: Report, quick: bool) -> None:
    """Memory placement against hand-written groups and one swap group over several traces, and one decision's cost."""
    seeds, hours, samples = placement.SEEDS, 1.0 if quick else placement.HOURS, 100 if quick else 300
    judged = placement.over_seeds(seeds, hours)
    first = judged.comparisons[seeds[0]]
    report.judge(f"memory placement against the best hand-written groups, 6 models on 2 GPUs, seeds "
                 f"{', '.join(map(str, seeds))}, {hours:g} h each (core replay)",
                 "median over the seeds of placement ÷ best groups' (each seed's in brackets): GPU-seconds loading; "
                 "interactive wait p99", "< 1; ≤ 1", judged.measured(), judged.met())
    decisions = placement.measure_decisions(samples)
    worst = placement.decision_worst_p99(decisions)
    report.judge(f"placement decision with {placement.DECISION_LOADED} models loaded on {placement.DECISION_GPUS} "
                 f"GPUs, a request that needs models stopped, {samples} a case (core only)",
                 "scheduler submit p99, worse case", f"≤ {placement.TARGET_DECISION_MS:g} ms", f"{worst:.2f} ms",
                 worst <= placement.TARGET_DECISION_MS)
    report.section(f"Memory placement: {len(seeds)} traces of {hours:g} h, and one decision's cost",
                   placement.method(seeds, hours, samples),
                   f"Seed {seeds[0]}'s trace, {first.requests:,} requests:",
                   [placement.COMPARISON_HEADER, *placement.comparison_rows(first)], placement.verdict_lines(first),
                   "Every seed, and the medians the target is judged on:",
                   [placement.SEEDS_HEADER, *placement.seed_rows(judged)],
                   [placement.DECISION_HEADER, *placement.decision_rows(decisions)])


def slots_part(report: Report, sizes: Sizes) -> None:
    """Embeddings beside a batch job, concurrent streams on slots, and the service's CPU per chunk."""
    beside = slots.measure_embeddings(sizes.embeddings, sizes.embeddings_blocks, sizes.single_slot_rounds)
    streams, tokens, tps = slots.STREAMS, slots.STREAM_TOKENS, slots.JOB_TPS
    runs = slots.measure_slots(streams, tokens, tps, sizes.slot_rounds, sizes.cpu_tokens)

    idle, busy, waited = stats(beside.idle_ms), stats(beside.busy_ms), stats(beside.single_slot_ms)
    what = f"embeddings beside a batch job on the chat model (own persistent group), {busy.n} requests a side"
    report.judge(what, "busy p50 − idle p50", f"≤ {slots.EMBEDDINGS_ADDED_TARGET_MS:g} ms",
                 f"{beside.added_p50:+.2f} ms (idle {idle.p50:.2f}, busy {busy.p50:.2f})",
                 beside.added_p50 <= slots.EMBEDDINGS_ADDED_TARGET_MS)
    report.figure(f"{what}: p99", f"idle {idle.p99:.2f} ms, busy {busy.p99:.2f} ms")
    report.figure(f"embeddings in one swap group with the chat model (single slot), sent at the first chunk of a "
                  f"{beside.job_seconds:g} s job, {waited.n} rounds", f"waited p50 {waited.p50:,.0f} ms, max {waited.max:,.0f} ms")
    ratio = runs.ratio(streams)
    report.judge(f"{streams} concurrent streams of {tokens} tokens at {tps} tokens/s, `slots: {streams}` against "
                 f"`slots: 1`, {sizes.slot_rounds} rounds", "p50 of per-round tokens/s ratios",
                 f"≥ {slots.THROUGHPUT_TARGET:g}", f"{ratio:.2f}", ratio >= slots.THROUGHPUT_TARGET)
    def per_chunk(bursts: list[slots.StreamBurst]) -> str:
        return f"{slots.median_of(bursts, lambda r: r.cpu_us_per_chunk):.0f} µs"

    report.figure(f"service CPU per streamed chunk, stand-in unpaced, {sizes.cpu_tokens:,} tokens a stream",
                  f"1 stream {per_chunk(runs.cpu_one)}, {streams} concurrent streams {per_chunk(runs.cpu_many)}")
    report.figure(f"service CPU per streamed chunk at {tps} tokens/s a stream, {tokens} tokens a stream",
                  f"1 stream at a time {per_chunk(runs.slots[1])}, {streams} concurrent streams "
                  f"{per_chunk(runs.slots[streams])}")
    report.section(
        "Coexisting models and slots",
        slots.embeddings_table(beside),
        slots.slots_table(runs, streams, tokens, tps),
        slots.cpu_table(runs, streams, tps),
    )


def parity_part(report: Report, sizes: Sizes) -> None:
    """Peers, WebSockets, captures and llama-swap's activity API, each beside its own baseline; no targets."""
    parity = llama_swap_parity
    run = parity.measure(sizes.requests, sizes.ws_messages, sizes.ws_bulk_messages, sizes.capture_streams,
                         sizes.activity_rows)
    peer_added, local_added = (stats(added(run.relay[name], run.relay[base]))
                               for name, base in parity.RELAY_BASELINES.items())
    report.figure(f"added latency relayed to a peer (`peers:`), tiny chat, {sizes.requests} rounds; a local model "
                  "through the scheduler in the same rotation",
                  f"p50 {peer_added.p50:+.2f} ms, p99 {peer_added.p99:+.2f} ms "
                  f"(local: p50 {local_added.p50:+.2f} ms, p99 {local_added.p99:+.2f} ms)")
    direct, through = run.websocket.round_trip.values()
    message = stats(added(through, direct))
    report.figure(f"WebSocket passthrough, 100-byte text message echoed, {sizes.ws_messages} rounds: added",
                  f"p50 {message.p50:+.2f} ms, p99 {message.p99:+.2f} ms")
    direct_rate, through_rate = (statistics.median(map(parity.mib_per_s, samples))
                                 for samples in run.websocket.bulk.values())
    report.figure(f"WebSocket passthrough, 1 MiB messages echoed, {sizes.ws_bulk_messages} rounds",
                  f"{through_rate:,.0f} MiB/s both ways, {parity.bulk_ratio(run.websocket):.2f} of direct "
                  f"({direct_rate:,.0f} MiB/s)")
    capture = stats(added(run.captures.chat[parity.WITH], run.captures.chat[parity.WITHOUT]))
    report.figure(f"`captureBuffer: {parity.CAPTURE_MB}` against none: tiny chat, {sizes.requests} rounds, added; "
                  f"a {parity.STREAM_TOKENS:,}-token stream, {sizes.capture_streams} rounds",
                  f"p50 {capture.p50:+.2f} ms, p99 {capture.p99:+.2f} ms; the stream "
                  f"{parity.stream_ratio(run.captures):.2f}× as long")
    report.figure(f"llama-swap's activity API on {sizes.activity_rows:,} ended rows (SQLite), seconds a call, "
                  f"median of {parity.ACTIVITY_CALLS}",
                  ", ".join(f"{label} {statistics.median(seconds):.2f} s"
                            for label, seconds in run.activity.seconds.items()))
    report.section("llama-swap parity: peers, WebSockets, captures, the activity API", *parity.tables(run))


def capacity_part(report: Report, sizes: Sizes) -> None:
    result = load.measure(sizes.capacity_clients, sizes.capacity_models)
    report.judge(f"queue capacity, {result.requests:,} queued connections",
                 "requests lost, served twice or out of priority-then-arrival order", "none",
                 "none" if not result.problems else "; ".join(result.problems), not result.problems)
    report.figure(f"queue capacity, {result.requests:,} queued connections: the service's peak RSS",
                  f"{result.peak_rss_mib:.0f} MiB")
    report.section(f"Queue capacity: {result.requests:,} concurrent queued connections",
                   [load.HEADER, load.row(result)])


def distributed_part(report: Report, sizes: Sizes) -> None:
    """A worker and front ends over Redis and PostgreSQL beside one process, over each channel layer, and a
    failover; skipped without those two."""
    def what(layer: str) -> str:
        return (f"added latency through a front end, distributed mode, {layer} channel layer, tiny chat, "
                f"{sizes.requests} rounds")

    bound = f"≤ {distributed.ADDED_TARGET_MS:g} ms"
    try:
        run = distributed.measure(sizes.requests, sizes.jobs, sizes.requests, sizes.throughput_requests,
                                  sizes.throughput_rounds)
    except distributed.Unavailable as exc:
        print(f"[bench] distributed mode skipped: {exc}", file=sys.stderr, flush=True)
        for layer in distributed.LAYERS:
            report.not_measured(what(layer), "added p50", bound, str(exc))
        return
    for layer in distributed.LAYERS:
        extra = stats(run.added(distributed.FRONT_END, distributed.DIRECT, layer))
        alone = stats(run.added(distributed.ALONE, distributed.ALONE_DIRECT, layer))
        report.judge(what(layer), "added p50", bound, f"{extra.p50:+.2f} ms", run.meets_target(layer))
        report.figure(f"{what(layer)}: added p95, and one process's in the same rotation",
                      f"{extra.p95:+.2f} ms (one process: p50 {alone.p50:+.2f} ms, p95 {alone.p95:+.2f} ms)")
    grant, gap = run.scheduling.grant, run.scheduling.gap
    for name, samples in (("grant round trip", grant), ("dispatch gap", gap)):
        one = stats(samples[distributed.ONE_PROCESS])
        for layer in distributed.LAYERS:
            over = stats(samples[distributed.over(layer)])
            report.figure(f"distributed mode: {name} over Redis ({layer} layer) against in-process, runtime-level "
                          f"(both ends in the bench's process), {over.n} a side",
                          f"p50 {over.p50:.2f} ms ({over.p50 / one.p50:.0f}× one process's {one.p50 * 1000:.0f} µs)")
    for layer in distributed.LAYERS:
        two = run.rps_ratio(distributed.TWO_FRONT_ENDS, distributed.ONE_FRONT_END, layer)
        one = run.rps_ratio(distributed.ONE_FRONT_END, distributed.ONE_PROCESS, layer)
        report.figure(f"distributed mode, {layer} channel layer: tiny chats/s, {distributed.CLIENTS} clients, "
                      f"{sizes.throughput_requests:,} requests, {sizes.throughput_rounds} rounds",
                      f"two front ends {two:.2f}× one front end; one front end {one:.2f}× one process")
    failover, model = stats(run.failover.answered), stats(run.failover.model_start)
    report.figure(f"distributed mode: failover, `kill -9` of the serving worker to the first queued chat's answer "
                  f"with a standby standing by, {failover.n} kills",
                  f"median {failover.p50:.0f} ms, max {failover.max:.0f} ms (the fake model's own start: median "
                  f"{model.p50:.0f} ms)")
    report.section(
        "Distributed mode: one worker and front ends over Redis and PostgreSQL, beside one process",
        distributed.comparison_table(distributed.comparisons(run)),
        distributed.scheduling_table(run.scheduling),
        distributed.latency_table(run),
        distributed.throughput_table(run, sizes.throughput_requests),
        distributed.failover_table(run.failover),
    )


def quotas_part(report: Report, quick: bool) -> None:
    """The quota gate's cost per request of a key with rpm, tpm and concurrency, counted here and in Redis."""
    results, why = key_quotas.measure(key_quotas.QUICK_ROUNDS if quick else key_quotas.ROUNDS)
    for result in results:
        report.figure(f"API key quotas: latency added per request of a key with rpm, tpm and concurrency, counted "
                      f"{result.counter}, {result.added_us.n} rounds",
                      f"p50 {result.added_us.p50:+.0f} µs, p95 {result.added_us.p95:+.0f} µs")
    blocks: list[list[str] | str] = [[key_quotas.HEADER, *(key_quotas.row(result) for result in results)]]
    if why:
        blocks.append(f"Redis not measured: {why}")
    report.section("API key quotas: the gate's added latency per request", *blocks)


def batches_part(report: Report, quick: bool) -> None:
    """A batch's added cost per line against a client sending the same requests, and memory at two file sizes."""
    result = batches.measure_per_line(2_000 if quick else 10_000)
    report.judge(f"Batch API, {result.lines:,} tiny lines, one slot, against a client sending them one at a time",
                 "added per line (wall time difference ÷ lines)", f"≤ {batches.TARGET_ADDED_MS:g} ms",
                 f"{result.added_ms:.2f} ms", result.added_ms <= batches.TARGET_ADDED_MS)
    large = {lines: batches.large_batch(lines) for lines in (10_000, 50_000, 100_000)}
    report.figure("Batch API: service peak RSS through a 10 000-, a 50 000- and a 100 000-line batch (read, cancelled, written)",
                  ", ".join(f"{run.peak_mib:.0f} MiB" for run in large.values()))
    report.figure("Batch API: cancelling a 10 000-, a 50 000- and a 100 000-line batch, to `cancelled` with its files",
                  ", ".join(f"{run.cancel_s:.1f} s" for run in large.values()))
    report.section("Batch API: cost per line and memory",
                   batches.per_line_table(result), batches.memory_table(large))


# -- the report --------------------------------------------------------------------------------

# Each summary row ends with its part's mark, a cell past the table's last column (which markdown drops), and
# each part's sections lie between its marks, so a run of some parts can replace what they wrote before.
TARGETS_HEADER = "| what | statistic judged | target | measured | verdict |"
FIGURES_HEADER = "| figures without a target | measured |"


def mark(part: str) -> str:
    return f"<!-- part:{part} -->"


def end_mark(part: str) -> str:
    return f"<!-- /part:{part} -->"


def target_rows(report: Report) -> list[str]:
    return [f"| {t.what} | {t.statistic} | {t.bound} | {t.measured} | {t.verdict} | {mark(t.part)}"
            for t in report.targets]


def figure_rows(report: Report) -> list[str]:
    return [f"| {what} | {value} | {mark(part)}" for what, value, part in report.figures]


def section_blocks(report: Report) -> dict[str, str]:
    """Each part's sections, between its marks."""
    texts: dict[str, list[str]] = {}
    for part, text in report.sections:
        texts.setdefault(part, []).append(text)
    return {part: f"{mark(part)}\n\n" + "\n\n".join(found) + f"\n\n{end_mark(part)}" for part, found in texts.items()}


def render(report: Report, command: str, load_before: str, seconds: float, peer_version: str) -> str:
    found = versions()
    found["litellm"] = peer_version
    lines = [
        f"Generated by `{command}` on {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, in {seconds / 60:.1f} min.",
        "",
        f"- machine: {machine()}",
        f"- load average (1/5/15 min): before {load_before}, after {load_average()}",
        "- versions: " + ", ".join(f"{name} {version}" for name, version in found.items()),
        "",
        "#### Summary",
        "",
        "Each target is judged on exactly the statistic named beside it; the tables after the summary "
        "hold every figure.",
        "",
        TARGETS_HEADER,
        "|---|---|---|---|---|",
        *target_rows(report),
        "",
        FIGURES_HEADER,
        "|---|---|",
        *figure_rows(report),
        "",
        *"\n\n".join(section_blocks(report).values()).splitlines(),
    ]
    return "\n".join(lines)


def results_of(path: Path) -> tuple[str, str, str]:
    """The text before the results markers, between them and after them."""
    document = path.read_text()
    if BEGIN not in document or END not in document:
        raise SystemExit(f"{path}: no results markers; add a line `{BEGIN}` and a line `{END}` where the results go")
    head, rest = document.split(BEGIN, 1)
    between, tail = rest.split(END, 1)
    return head, between.strip("\n"), tail


def write_between_markers(path: Path, text: str) -> None:
    head, _, tail = results_of(path)
    path.write_text(f"{head}{BEGIN}\n{text}\n{END}{tail}")


def splice(results: str, report: Report, parts: list[str], command: str, load_before: str) -> str:
    """`results` with what `parts` wrote replaced by `report`: their summary rows, their sections, and a line
    under the heading saying when and how they were run again."""
    marks = tuple(mark(part) for part in parts)
    lines = [line for line in results.splitlines()
             if not (line.startswith("|") and line.endswith(marks))
             and not line.startswith(tuple(f"- {part} run again" for part in parts))]
    for header, rows in ((TARGETS_HEADER, target_rows(report)), (FIGURES_HEADER, figure_rows(report))):
        if header not in lines:
            raise SystemExit(f"the results have no table headed {header!r}: run the whole suite with --write")
        end = lines.index(header) + 1
        while end < len(lines) and lines[end].startswith("|"):
            end += 1
        lines[end:end] = rows
    when = f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC"
    blank = lines.index("")  # the generated line, then the machine's lines: these go after them
    while blank + 1 < len(lines) and lines[blank + 1].startswith("- "):
        blank += 1
    load = f"load average before: {load_before}, after: {load_average()}"  # other work skews it while it runs
    lines[blank + 1:blank + 1] = [f"- {part} run again by `{command}` on {when} ({load})" for part in parts]
    text = "\n".join(lines)
    for part, block in section_blocks(report).items():
        start = f"\n{mark(part)}\n"  # a line of its own: a summary row ends with the mark too
        if start in text:
            before, rest = text.split(start, 1)
            _, after = rest.split(end_mark(part), 1)
            text = f"{before}\n{block}{after}"
        else:
            text = f"{text}\n\n{block}"
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="every part at a smaller size")
    parser.add_argument("--no-peer", action="store_true", help="skip LiteLLM (no install, no start)")
    parser.add_argument("--write", type=Path, metavar="FILE", help="put the report between FILE's results markers")
    parser.add_argument("--only", nargs="+", metavar="PART",
                        help="run only these parts (their names with hyphens: data-path, distributed-mode, …); "
                        "with --write, only what they wrote before is replaced")
    parser.add_argument("--baseline", metavar="COMMIT",
                        help="adds the part data-path-a-b: the data path of COMMIT's tree beside this one's")
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    command = " ".join([".venv/bin/python bench/suite.py", *(argv if argv is not None else sys.argv[1:])])

    started = time.monotonic()
    load_before = load_average()
    report = Report()
    parts = {
        "scheduling core": lambda: core_part(report),
        "data path": lambda: data_path_part(report, sizes),
        "peer": lambda: peer_part(report, sizes, not args.no_peer),
        "interactive wait": lambda: interactive_part(report, sizes),
        "swap thrash": lambda: thrash_part(report, sizes),
        "wait prediction": lambda: prediction_part(report, sizes),
        "replay": lambda: replay_part(report, sizes),
        "wait prediction over seeds": lambda: prediction_seeds_part(report, args.quick),
        "replay what-if": lambda: whatif_part(report, args.quick),
        "memory placement": lambda: placement_part(report, args.quick),
        "coexisting models and slots": lambda: slots_part(report, sizes),
        "llama-swap parity": lambda: parity_part(report, sizes),
        "queue capacity": lambda: capacity_part(report, sizes),
        "distributed mode": lambda: distributed_part(report, sizes),
        "key quotas": lambda: quotas_part(report, args.quick),
        "batches": lambda: batches_part(report, args.quick),
    }
    if args.baseline:
        parts["data path a-b"] = lambda: data_path_ab_part(report, sizes, args.baseline)
    elif args.only and "data-path-a-b" in args.only:
        parser.error("--only data-path-a-b: needs --baseline COMMIT")
    chosen = {hyphenated(name): name for name in parts}
    if args.only and (unknown := [name for name in args.only if name not in chosen]):
        parser.error(f"--only: no part {', '.join(unknown)}; the parts: {', '.join(chosen)}")
    for name in [chosen[name] for name in args.only] if args.only else parts:
        report.part(name, parts[name])
    peer_version = (peer.installed_version() or "not installed") + " (peer, in .bench-venv/)"
    text = render(report, command, load_before, time.monotonic() - started, peer_version)
    print(text)
    if args.write:
        path = args.write if args.write.is_absolute() else REPO / args.write
        if args.only:
            text = splice(results_of(path)[1], report, args.only, command, load_before)
        write_between_markers(path, text)
        print(f"\n[bench] results written into {args.write}", file=sys.stderr)
    if report.failed:
        print(f"[bench] failed: {', '.join(report.failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
