"""What llamaswap itself costs a request: added latency, time to first chunk, the gap between serial jobs.

    .venv/bin/python bench/proxy.py [--requests 300] [--jobs 200] [--streams 100]

Starts its own `llamaswap serve` with one fake model at `--tps 0` (answers take microseconds), so
what remains is the proxy. Latency and first chunk compare the same request through llamaswap and
straight to the model, on one keep-alive client, alternating so drift hits both sides alike. The
dispatch gap is read from the model's own event log: the end of job n to the start of job n+1,
while `--jobs` requests wait in the serial queue; the same gap with one client sending straight
to the model, request after request, is the floor it is compared with.

    .venv/bin/python bench/proxy.py --baseline COMMIT [--requests 300] [--jobs 200] [--streams 100]

A/B: serves COMMIT's tree (`git archive` into a temporary folder, run with this venv: only the project's code
differs) beside this one, each with its own fake model. The chat and first-chunk rounds alternate over all four
(each side's model, then the side), the dispatch gap and its floor alternate side by side in rounds of a quarter of
`--jobs`; it prints both and the ratio current ÷ baseline."""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (  # noqa: E402
    CHAT, MODEL, REPO, added, chat_call, direct_base, first_chunk_call, load_average, machine, stats, timed_rounds,
    until_queued,
)
from tests.served import Served, fake_cmd, model_ports, read_events  # noqa: E402

CONNECT_WAVE = 25  # new connections opened at once while filling the queue
TARGETS_MS = {  # from the project's goals; reported, not enforced
    "dispatch gap": (1.0, 5.0),
    "added latency": (2.0, 10.0),
    "first chunk added": (2.0, None),
}


def model_cmd(events: Path) -> str:
    """The fake model's command, the same program on both sides of an A/B: `-I` keeps the serving checkout (the
    model's working directory and PYTHONPATH) off its import path, so it runs this venv's fakemodel and proxy,
    never a baseline's (a tree from before fakemodel/ existed, or whose proxy modules it imports were named
    otherwise)."""
    return fake_cmd(MODEL, events, "--tps", "0").replace(" -m fakemodel ", " -I -m fakemodel ", 1)


def config_text(events: Path) -> str:
    return f"""
        healthCheckTimeout: 15
        startPort: {model_ports(1)}
        models:
          {MODEL}:
            cmd: {model_cmd(events)}
            proxy: http://127.0.0.1:${{PORT}}
        routing:
          scheduler:
            use: serial
    """


@contextmanager
def served_model(tmp: Path, more_config: str = "", repo: Path = REPO) -> Iterator[tuple[Served, Path]]:
    """llamaswap with the one fake model loaded (`more_config`: top-level keys added to its config; `repo`: the
    checkout that serves); yields the service and the model's event log."""
    events = tmp / "events.jsonl"
    with Served(tmp, textwrap.dedent(config_text(events)) + more_config, repo=repo) as served:
        with httpx.Client(timeout=30) as client:
            chat_call(client, served.base)()  # loads the model
        yield served, events


@dataclass(frozen=True)
class Overhead:
    """Milliseconds per request by target ("direct" is the model itself), one sample per round."""

    chat: dict[str, list[float]]
    first_chunk: dict[str, list[float]]


def measure_overhead(client: httpx.Client, targets: dict[str, str], requests: int, streams: int) -> Overhead:
    """Tiny chat requests and first SSE chunks against every target in turn, round after round."""
    chat = timed_rounds({name: chat_call(client, base) for name, base in targets.items()}, requests)
    first = timed_rounds({name: first_chunk_call(client, base) for name, base in targets.items()}, streams)
    return Overhead(chat, first)


async def queue_serial_jobs(served: Served, jobs: int, prefix: str = "job-") -> None:
    """Hold the model with a stream, queue `jobs` requests behind it, then let the queue drain.

    The jobs connect in waves of `CONNECT_WAVE`, each once the previous one is queued, so the
    service's accept backlog never decides the order or adds SYN-retry delays.
    """
    limits = httpx.Limits(max_connections=jobs + 1, max_keepalive_connections=jobs + 1)
    async with httpx.AsyncClient(base_url=served.base, limits=limits, timeout=120) as client:
        blocker = {**CHAT, "stream": True, "fake": {"id": "blocker", "tokens": 100_000, "tps": 10}}
        async with client.stream("POST", "/v1/chat/completions", json=blocker) as held:
            lines = held.aiter_lines()  # kept: a dropped iterator would be finalised and close the stream
            await anext(lines)  # the blocker now owns the model
            pending = []
            for first in range(0, jobs, CONNECT_WAVE):
                pending += [
                    asyncio.create_task(client.post("/v1/chat/completions", json={**CHAT, "fake": {"id": f"{prefix}{i}"}}))
                    for i in range(first, min(first + CONNECT_WAVE, jobs))
                ]
                await until_queued(served.data_dir, len(pending))
        # Leaving the stream disconnects the blocker; the queue now runs back to back.
        responses = await asyncio.gather(*pending)
    failed = [r.status_code for r in responses if r.status_code != 200]
    if failed:
        raise RuntimeError(f"{len(failed)} queued jobs failed: HTTP {sorted(set(failed))}")


def dispatch_gaps_ms(served: Served, events_path: Path, jobs: int, prefix: str = "job-") -> list[float]:
    """Queue `jobs` serial jobs and return, in dispatch order, end of job n to start of job n+1 at the model
    (`prefix`: their ids' start, unique to this call)."""
    asyncio.run(queue_serial_jobs(served, jobs, prefix))
    return gaps_at_model(events_path, prefix, jobs)


def floor_gaps_ms(model_base: str, events_path: Path, jobs: int, prefix: str = "direct-") -> list[float]:
    """The same gap with one client straight to the model, each request sent once the previous answer
    is read: what the model and a client cost between two jobs, the floor for any proxy."""
    with httpx.Client(timeout=30) as client:
        for index in range(jobs):
            chat_call(client, model_base, {**CHAT, "fake": {"id": f"{prefix}{index}"}})()
    return gaps_at_model(events_path, prefix, jobs)


def gaps_at_model(events_path: Path, prefix: str, jobs: int) -> list[float]:
    """From the model's event log: end of job n to start of job n+1, for the ids starting with `prefix`.

    The model logs "end" before a response's last bytes, so every answered job has both events."""
    events = [e for e in read_events(events_path) if str(e["id"]).startswith(prefix)]
    starts = {e["id"]: e["t"] for e in events if e["event"] == "start"}
    ends = {e["id"]: e["t"] for e in events if e["event"] == "end"}
    if len(starts) != jobs or len(ends) != jobs:
        raise RuntimeError(f"the model saw {len(starts)} starts and {len(ends)} ends for {jobs} jobs")
    order = sorted(starts, key=starts.get)
    gaps = [(starts[nxt] - ends[prev]) * 1000 for prev, nxt in zip(order, order[1:])]
    if min(gaps) < 0:
        raise RuntimeError("two jobs ran at the same time: they were not serialised")
    return gaps


# -- A/B: a baseline commit served beside this tree ---------------------------------------------

AB_ROUNDS = 4  # the dispatch gap and its floor alternate between the sides in this many rounds
AB_TARGETS = {"added p50 ms": 1.0, "gap p50 ÷ floor p50": 2.0}  # the current tree's, in the A/B run


def baseline_tree(commit: str, into: Path) -> tuple[str, Path]:
    """`commit`'s files (`git archive`) under `into`, and its short hash: served with this venv and
    interpreter, so only the project's own code differs between the sides."""
    rev = subprocess.run(["git", "rev-parse", "--short", commit], cwd=REPO, check=True, capture_output=True,
                         text=True).stdout.strip()
    tree = into / f"baseline-{rev}"
    tree.mkdir(parents=True)
    archive = subprocess.Popen(["git", "archive", rev], cwd=REPO, stdout=subprocess.PIPE)
    subprocess.run(["tar", "-x", "-C", str(tree)], stdin=archive.stdout, check=True)
    if archive.wait() != 0:
        raise RuntimeError(f"git archive {rev} failed")
    return rev, tree


@dataclass(frozen=True)
class AB:
    """Both sides' samples in one run: chat and first chunk by target ("direct (baseline)", "baseline",
    "direct", "llamaswap"), gaps and floors by side ("baseline", "llamaswap")."""

    rev: str
    overhead: Overhead
    gaps: dict[str, list[float]]
    floors: dict[str, list[float]]

    def added(self, samples: dict[str, list[float]], side: str) -> list[float]:
        return added(samples[side], samples["direct (baseline)" if side == "baseline" else "direct"])


def measure_ab(tmp: Path, commit: str, requests: int, streams: int, jobs: int) -> AB:
    """The baseline commit and this tree, each with its own fake model, measured in one alternating run."""
    rev, tree = baseline_tree(commit, tmp)
    (tmp / "a").mkdir()
    (tmp / "b").mkdir()
    with (served_model(tmp / "a", repo=tree) as (base, base_events), served_model(tmp / "b") as (current, events),
          httpx.Client(timeout=30) as client):
        targets = {"direct (baseline)": direct_base(base.base), "baseline": base.base,
                   "direct": direct_base(current.base), "llamaswap": current.base}
        chat = timed_rounds({name: chat_call(client, url) for name, url in targets.items()}, requests, shift=2)
        first = timed_rounds({name: first_chunk_call(client, url) for name, url in targets.items()}, streams, shift=2)
        sides = {"baseline": (base, base_events, targets["direct (baseline)"]),
                 "llamaswap": (current, events, targets["direct"])}
        gaps: dict[str, list[float]] = {side: [] for side in sides}
        floors: dict[str, list[float]] = {side: [] for side in sides}
        for index in range(AB_ROUNDS):
            for side in (list(sides) if index % 2 == 0 else list(sides)[::-1]):
                served, log, model = sides[side]
                gaps[side] += dispatch_gaps_ms(served, log, jobs // AB_ROUNDS, f"r{index}-job-")
                floors[side] += floor_gaps_ms(model, log, jobs // AB_ROUNDS, f"r{index}-direct-")
    return AB(rev, Overhead(chat, first), gaps, floors)


def ab_table(ab: AB) -> list[str]:
    """Each statistic for the baseline, this tree and the ratio this ÷ baseline."""
    rows = []
    for what, samples in (("chat, non-streaming", ab.overhead.chat), ("first SSE chunk", ab.overhead.first_chunk)):
        n = len(samples["direct"])
        for name, pick in (("added p50 ms", lambda s: s.p50), ("added p99 ms", lambda s: s.p99)):
            old, new = (pick(stats(ab.added(samples, side))) for side in ("baseline", "llamaswap"))
            rows.append((f"{what}, {n} rounds: {name}", old, new))
    for side_name, pick in (("p50", lambda s: s.p50), ("p99", lambda s: s.p99)):
        old, new = (pick(stats(ab.gaps[side])) for side in ("baseline", "llamaswap"))
        rows.append((f"gap between serial jobs, {len(ab.gaps['llamaswap'])} gaps: {side_name} ms", old, new))
    for side_name in ("p50",):
        old, new = (stats(ab.floors[side]).p50 for side in ("baseline", "llamaswap"))
        rows.append(("floor, one client straight to the model: p50 ms", old, new))
    old, new = (stats(ab.gaps[side]).p50 / stats(ab.floors[side]).p50 for side in ("baseline", "llamaswap"))
    rows.append(("gap p50 ÷ floor p50", old, new))
    lines = [f"| A/B, one run, alternating | baseline `{ab.rev}` | this tree | this ÷ baseline |", "|---|--:|--:|--:|"]
    for what, old, new in rows:
        ratio = f"{new / old:.2f}" if old > 0 else "—"
        lines.append(f"| {what} | {old:.2f} | {new:.2f} | {ratio} |")
    return lines


def ab_verdicts(ab: AB) -> list[tuple[str, float, float, bool]]:
    """(statistic, this tree's value, bound, met) for each A/B target."""
    chat = stats(ab.added(ab.overhead.chat, "llamaswap")).p50
    gap = stats(ab.gaps["llamaswap"]).p50 / stats(ab.floors["llamaswap"]).p50
    return [(name, value, AB_TARGETS[name], value <= AB_TARGETS[name])
            for name, value in (("added p50 ms", chat), ("gap p50 ÷ floor p50", gap))]


def verdict(target: str, samples: list[float]) -> str:
    """"met" or "MISSED" against the p50 (and p99, where there is one) target in milliseconds."""
    summary = stats(samples)
    p50, p99 = TARGETS_MS[target]
    met = summary.p50 <= p50 and (p99 is None or summary.p99 <= p99)
    limits = f"p50 ≤ {p50:g} ms" + (f", p99 ≤ {p99:g} ms" if p99 is not None else "")
    return f"{limits}: {'met' if met else 'MISSED'}"


def overhead_table(title: str, samples: dict[str, list[float]]) -> list[str]:
    """One row per target; "added" is the per-round difference to the model itself ("direct")."""
    lines = [f"| {title} | p50 ms | p99 | mean | added p50 | added p99 |", "|---|--:|--:|--:|--:|--:|"]
    for name, through in samples.items():
        summary = stats(through)
        cells = [f"{summary.p50:.2f}", f"{summary.p99:.2f}", f"{summary.mean:.2f}"]
        if name == "direct":
            cells += ["", ""]
        else:
            extra = stats(added(through, samples["direct"]))
            cells += [f"{extra.p50:+.2f}", f"{extra.p99:+.2f}"]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def gap_table(gaps: list[float], floor: list[float]) -> list[str]:
    lines = [f"| gap between serial jobs at the model, {len(gaps) + 1} jobs | p50 ms | p99 | mean | max |",
             "|---|--:|--:|--:|--:|"]
    for name, samples in (("queued in llamaswap (dispatch gap)", gaps),
                          ("one client straight to the model, sequential (floor)", floor)):
        summary = stats(samples)
        lines.append(f"| {name} | {summary.p50:.2f} | {summary.p99:.2f} | {summary.mean:.2f} | {summary.max:.2f} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300, help="non-streaming requests per side")
    parser.add_argument("--jobs", type=int, default=200, help="serial jobs queued for the dispatch gap")
    parser.add_argument("--streams", type=int, default=100, help="streams per side for time to first chunk")
    parser.add_argument("--baseline", metavar="COMMIT", help="A/B: serve COMMIT's tree beside this one, alternating")
    args = parser.parse_args(argv)

    load_before = load_average()
    if args.baseline:
        with tempfile.TemporaryDirectory(prefix="llamaswap-bench-") as tmp:
            ab = measure_ab(Path(tmp), args.baseline, args.requests, args.streams, args.jobs)
        print(f"machine: {machine()}")
        print(f"load average (1/5/15 min) before: {load_before}, after: {load_average()}")
        print(f"command: .venv/bin/python bench/proxy.py --baseline {args.baseline} --requests {args.requests} "
              f"--jobs {args.jobs} --streams {args.streams}")
        print()
        print("\n".join(ab_table(ab)))
        print()
        for name, value, bound, ok in ab_verdicts(ab):
            print(f"{name}: {value:.2f} (≤ {bound:g}): {'met' if ok else 'MISSED'}")
        return 0
    with tempfile.TemporaryDirectory(prefix="llamaswap-bench-") as tmp:
        with served_model(Path(tmp)) as (served, events), httpx.Client(timeout=30) as client:
            targets = {"direct": direct_base(served.base), "llamaswap": served.base}
            overhead = measure_overhead(client, targets, args.requests, args.streams)
            gaps = dispatch_gaps_ms(served, events, args.jobs)
            floor = floor_gaps_ms(targets["direct"], events, args.jobs)

    print(f"machine: {machine()}")
    print(f"load average (1/5/15 min) before: {load_before}, after: {load_average()}")
    print(f"command: .venv/bin/python bench/proxy.py --requests {args.requests} --jobs {args.jobs} --streams {args.streams}")
    print()
    print("\n".join(overhead_table(f"chat, non-streaming, {args.requests} rounds", overhead.chat)))
    print()
    print("\n".join(overhead_table(f"first SSE chunk, {args.streams} rounds", overhead.first_chunk)))
    print()
    print("\n".join(gap_table(gaps, floor)))
    print()
    print("added latency:", verdict("added latency", added(overhead.chat["llamaswap"], overhead.chat["direct"])))
    print("first chunk added:", verdict("first chunk added",
                                        added(overhead.first_chunk["llamaswap"], overhead.first_chunk["direct"])))
    print("dispatch gap:", verdict("dispatch gap", gaps))
    return 0


if __name__ == "__main__":
    sys.exit(main())
