"""Serial scheduling across models that coexist, and models with several slots.

    .venv/bin/python bench/slots.py [--embeddings 200] [--blocks 4] [--single-slot-rounds 5]
                                    [--streams 4] [--tokens 200] [--tps 50] [--rounds 2] [--cpu-tokens 10000]

Three measurements, each against a real `llamaswap serve` with fake models started through `cmd:`:

- Embeddings beside a batch job: a chat model in a swap group and an embeddings model in a
  persistent, non-exclusive group (they coexist). A tiny embeddings request is timed with the
  service idle and while a long streaming batch job runs on the chat model, in alternating blocks
  so drift hits both alike (target: busy p50 within 2 ms of idle p50). The same two models in one
  swap group (one job at a time) show what the embeddings request waited for before: the job.
- Slots: `--streams` concurrent streams of `--tokens` tokens at `--tps` tokens/s on a stand-in that
  serves that many requests at once (`--parallel`), with `slots` equal to it and with `slots: 1`,
  both services up side by side and measured in alternating rounds (target: ≥ 3.5× the tokens/s).
- The service's CPU (user + system of the llamaswap process, from /proc/PID/stat) per streamed
  chunk: one stream, then `--streams` concurrent streams, as fast as the stand-in writes (tps 0);
  and at `--tps` during the slot rounds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import MODEL, cpu_seconds, load_average, machine, stats  # noqa: E402
from tests.reliability.support import all_rows_terminal  # noqa: E402
from tests.served import Served, fake_cmd, model_ports  # noqa: E402

CHAT_MODEL = "chat"
EMBED_MODEL = "embed"
EMBEDDINGS = {"model": EMBED_MODEL, "input": "hi"}
BATCH = {"X-LlamaSwap-Priority": "batch"}
EMBEDDINGS_ADDED_TARGET_MS = 2.0
THROUGHPUT_TARGET = 3.5
JOB_TPS = 50  # the stand-ins' pace: a realistic model, so the model and not the proxy is the limit
STREAMS = 4  # concurrent streams, and the slots of the stand-in they run on
STREAM_TOKENS = 200
SINGLE_SLOT_JOB_TOKENS = 50  # one second at JOB_TPS: what an embeddings request waits for behind one job


# -- embeddings beside a batch job --------------------------------------------------------------

def embeddings_config(coexist: bool) -> str:
    """Chat and embeddings models: in their own groups (coexisting) or in one swap group."""
    groups = ({"chat": {"swap": True, "exclusive": True, "members": [CHAT_MODEL]},
               "embeddings": {"persistent": True, "swap": False, "exclusive": False, "members": [EMBED_MODEL]}}
              if coexist else {"gpu": {"swap": True, "members": [CHAT_MODEL, EMBED_MODEL]}})
    return yaml.safe_dump({
        "healthCheckTimeout": 15,
        "startPort": model_ports(2),
        "models": {name: {"cmd": fake_cmd(name, None, "--tps", str(JOB_TPS)), "proxy": "http://127.0.0.1:${PORT}"}
                   for name in (CHAT_MODEL, EMBED_MODEL)},
        "routing": {"router": {"use": "group", "settings": {"groups": groups}}, "scheduler": {"use": "serial"}},
    }, sort_keys=False)


class BatchJob:
    """A streaming batch chat job read in a thread; `started` is set once its first chunk arrived."""

    def __init__(self, base: str, tokens: int) -> None:
        self.started = threading.Event()
        self._stop = threading.Event()
        self._body = {"model": CHAT_MODEL, "messages": [{"role": "user", "content": "render"}], "stream": True,
                      "max_tokens": tokens}
        self._base = base
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            with httpx.Client(base_url=self._base, timeout=300) as client, \
                    client.stream("POST", "/v1/chat/completions", json=self._body, headers=BATCH) as response:
                if response.status_code != 200:
                    raise RuntimeError(f"the batch job got HTTP {response.status_code}")
                for line in response.iter_lines():
                    if line.startswith("data:"):
                        self.started.set()
                    if self._stop.is_set():
                        return  # leaving the stream disconnects the job, as a cancelled client does
        except BaseException as exc:  # noqa: BLE001 - reported when the job is entered or left
            self.error = exc
        finally:
            self.started.set()

    def __enter__(self) -> BatchJob:
        self._thread.start()
        self.started.wait(60)
        if self.error is not None or not self.started.is_set():
            self.__exit__()
            raise RuntimeError(f"the batch job did not start: {self.error}")
        return self

    def __exit__(self, *exc_info) -> None:
        """Wait for the job's end; one still running (longer than the measurement) is disconnected."""
        self._stop.set()
        self._thread.join(60)
        if self.error is not None and exc_info and exc_info[0] is None:
            raise RuntimeError(f"the batch job failed: {self.error}")


def embeddings_ms(client: httpx.Client) -> float:
    started = time.perf_counter()
    response = client.post("/v1/embeddings", json=EMBEDDINGS)
    elapsed = (time.perf_counter() - started) * 1000
    if response.status_code != 200:
        raise RuntimeError(f"embeddings: HTTP {response.status_code}: {response.text[:300]}")
    return elapsed


def warm(client: httpx.Client) -> None:
    """Load both models (the embeddings model last, so in one swap group it is the one loaded)."""
    chat = client.post("/v1/chat/completions", json={"model": CHAT_MODEL, "messages": [{"role": "user", "content": "hi"}],
                                                     "max_tokens": 1})
    if chat.status_code != 200:
        raise RuntimeError(f"chat: HTTP {chat.status_code}: {chat.text[:300]}")
    for _ in range(20):
        embeddings_ms(client)


@dataclass(frozen=True)
class EmbeddingsBeside:
    idle_ms: list[float]  # the embeddings request with the service idle (coexisting groups)
    busy_ms: list[float]  # the same while a batch job streams on the chat model
    single_slot_ms: list[float]  # one swap group: sent at the first chunk of a job, waits for it
    job_seconds: float  # the single-slot job's length

    @property
    def added_p50(self) -> float:
        return stats(self.busy_ms).p50 - stats(self.idle_ms).p50


def measure_embeddings(requests: int, blocks: int, single_slot_rounds: int) -> EmbeddingsBeside:
    per_block = max(1, requests // blocks)
    idle: list[float] = []
    busy: list[float] = []
    with tempfile.TemporaryDirectory(prefix="llamaswap-bench-") as tmp:
        with Served(Path(tmp), embeddings_config(coexist=True)) as served, \
                httpx.Client(base_url=served.base, timeout=30) as client:
            warm(client)
            running = {m["model"] for m in client.get("/running").json()["running"]}
            if running != {CHAT_MODEL, EMBED_MODEL}:
                raise RuntimeError(f"both models should stay loaded in their own groups; /running lists {running}")
            for _ in range(blocks):
                all_rows_terminal(served.data_dir, None, timeout=30)  # idle: nothing queued or running
                idle += [embeddings_ms(client) for _ in range(per_block)]
                with BatchJob(served.base, tokens=1_000_000):
                    busy += [embeddings_ms(client) for _ in range(per_block)]
    waits: list[float] = []
    with tempfile.TemporaryDirectory(prefix="llamaswap-bench-") as tmp:
        with Served(Path(tmp), embeddings_config(coexist=False)) as served, \
                httpx.Client(base_url=served.base, timeout=60) as client:
            warm(client)
            for _ in range(single_slot_rounds):
                all_rows_terminal(served.data_dir, None, timeout=30)
                with BatchJob(served.base, tokens=SINGLE_SLOT_JOB_TOKENS):
                    waits.append(embeddings_ms(client))
    return EmbeddingsBeside(idle, busy, waits, SINGLE_SLOT_JOB_TOKENS / JOB_TPS)


def embeddings_table(result: EmbeddingsBeside) -> list[str]:
    lines = ["| tiny embeddings request | n | p50 ms | p99 | mean | max |", "|---|--:|--:|--:|--:|--:|"]
    rows = (("service idle (own persistent group)", result.idle_ms),
            ("batch job streaming on the chat model (own persistent group)", result.busy_ms),
            (f"one swap group, sent at the first chunk of a {result.job_seconds:g} s job (single slot)",
             result.single_slot_ms))
    for name, samples in rows:
        s = stats(samples)
        lines.append(f"| {name} | {s.n} | {s.p50:,.2f} | {s.p99:,.2f} | {s.mean:,.2f} | {s.max:,.2f} |")
    return lines


# -- slots: concurrent streams ---------------------------------------------------------------

def slots_config(slots: int, parallel: int, tps: float) -> str:
    return yaml.safe_dump({
        "healthCheckTimeout": 15,
        "startPort": model_ports(1),
        "models": {MODEL: {"cmd": fake_cmd(MODEL, None, "--tps", f"{tps:g}", "--parallel", str(parallel)),
                           "proxy": "http://127.0.0.1:${PORT}"}},
        "routing": {"scheduler": {"use": "serial", "settings": {"serial": {"slots": {MODEL: slots}}}}},
    }, sort_keys=False)


def stream_chunks(base: str, tokens: int, tps: float | None = None) -> int:
    """One whole stream of `tokens` tokens read as raw bytes; returns the SSE events it carried."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": tokens, "stream": True}
    if tps is not None:
        body["fake"] = {"tps": tps}
    with httpx.Client(timeout=600) as client, \
            client.stream("POST", base + "/v1/chat/completions", json=body) as response:
        if response.status_code != 200:
            raise RuntimeError(f"{base}: HTTP {response.status_code}: {response.read()[:300]!r}")
        data = b"".join(response.iter_raw())
    events = data.count(b"data:")
    if events < tokens or b"[DONE]" not in data:
        raise RuntimeError(f"{base}: the stream carried {events} events for {tokens} tokens")
    return events


@dataclass(frozen=True)
class StreamBurst:
    """`streams` streams sent at once to one service."""

    streams: int
    tokens: int  # per stream
    seconds: float  # first request sent to the last stream's end
    chunks: int  # SSE events the clients received, all streams
    cpu_seconds: float  # the llamaswap process's user + system time meanwhile

    @property
    def tokens_per_second(self) -> float:
        return self.streams * self.tokens / self.seconds

    @property
    def cpu_us_per_chunk(self) -> float:
        return self.cpu_seconds / self.chunks * 1e6


def burst(served: Served, streams: int, tokens: int, tps: float | None = None) -> StreamBurst:
    pid = served.proc.pid
    cpu_before = cpu_seconds(pid)
    started = time.perf_counter()
    with ThreadPoolExecutor(streams) as pool:
        chunks = sum(pool.map(lambda _: stream_chunks(served.base, tokens, tps), range(streams)))
    seconds = time.perf_counter() - started
    return StreamBurst(streams, tokens, seconds, chunks, cpu_seconds(pid) - cpu_before)


@contextmanager
def slot_services(slot_counts: tuple[int, ...], parallel: int, tps: float) -> Iterator[dict[int, Served]]:
    """One service per slot count, all up at once, each with its model loaded."""
    with ExitStack() as stack:
        services = {}
        for slots in slot_counts:
            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="llamaswap-bench-")))
            services[slots] = stack.enter_context(Served(tmp, slots_config(slots, parallel, tps)))
            stream_chunks(services[slots].base, 4, tps=0)  # loads the model
        yield services


@dataclass(frozen=True)
class SlotRuns:
    slots: dict[int, list[StreamBurst]]  # slot count → one burst of concurrent streams per round
    cpu_one: list[StreamBurst]  # one stream at tps 0, per round
    cpu_many: list[StreamBurst]  # `streams` concurrent streams at tps 0, per round

    def ratio(self, many: int) -> float:
        """Median over rounds of the tokens/s with `many` slots ÷ with one slot."""
        return statistics.median(m.tokens_per_second / o.tokens_per_second
                                 for m, o in zip(self.slots[many], self.slots[1], strict=True))


def measure_slots(streams: int, tokens: int, tps: float, rounds: int, cpu_tokens: int) -> SlotRuns:
    counts = (1, streams)
    runs: dict[int, list[StreamBurst]] = {count: [] for count in counts}
    cpu_one: list[StreamBurst] = []
    cpu_many: list[StreamBurst] = []
    with slot_services(counts, streams, tps) as services:
        for _ in range(rounds):
            for count in counts:
                runs[count].append(burst(services[count], streams, tokens))
        for _ in range(rounds):
            cpu_one.append(burst(services[streams], 1, cpu_tokens, tps=0))
            cpu_many.append(burst(services[streams], streams, cpu_tokens, tps=0))
    return SlotRuns(runs, cpu_one, cpu_many)


def median_of(runs: list[StreamBurst], key) -> float:
    return statistics.median(key(run) for run in runs)


def slots_table(result: SlotRuns, streams: int, tokens: int, tps: float) -> list[str]:
    one = result.slots[1]
    lines = [f"| {streams} concurrent streams of {tokens} tokens at {tps:g} tokens/s, stand-in `--parallel {streams}`, "
             f"{len(one)} rounds | tokens/s p50 | seconds p50 | ÷ slots 1 (p50 of per-round ratios) |",
             "|---|--:|--:|--:|"]
    for count, runs in result.slots.items():
        ratio = "" if count == 1 else f"{result.ratio(count):.2f}"
        lines.append(f"| slots: {count} | {median_of(runs, lambda r: r.tokens_per_second):,.1f} "
                     f"| {median_of(runs, lambda r: r.seconds):.2f} | {ratio} |")
    return lines


def cpu_table(result: SlotRuns, streams: int, tps: float) -> list[str]:
    """The tps-0 runs (chunks arrive faster than the relay reads, so reads carry several) and the
    slot rounds at a model's pace (each chunk is read, relayed and written on its own)."""
    lines = [f"| service CPU per streamed chunk (user + system of the llamaswap process ÷ SSE events received), "
             f"{len(result.cpu_one)} rounds | streams at once | tokens/s a stream | chunks | seconds p50 "
             "| chunks/s p50 | CPU µs/chunk p50 |", "|---|--:|--:|--:|--:|--:|--:|"]
    unpaced = f"as fast as the stand-in writes, `slots: {streams}`"
    rows = ((unpaced, result.cpu_one, "unpaced"),
            (unpaced, result.cpu_many, "unpaced"),
            ("at a model's pace, `slots: 1` (one stream at a time)", result.slots[1], f"{tps:g}"),
            (f"at a model's pace, `slots: {streams}`", result.slots[streams], f"{tps:g}"))
    for name, runs, pace in rows:
        at_once = 1 if runs is result.slots[1] else runs[0].streams
        lines.append(f"| {name} | {at_once} | {pace} | {runs[0].chunks:,} | {median_of(runs, lambda r: r.seconds):.2f} "
                     f"| {median_of(runs, lambda r: r.chunks / r.seconds):,.0f} "
                     f"| {median_of(runs, lambda r: r.cpu_us_per_chunk):.0f} |")
    return lines


def verdicts(embeddings: EmbeddingsBeside, slots: SlotRuns, streams: int) -> list[str]:
    added = embeddings.added_p50
    ratio = slots.ratio(streams)
    return [
        f"embeddings beside a batch job: busy p50 − idle p50 = {added:+.2f} ms, target ≤ "
        f"{EMBEDDINGS_ADDED_TARGET_MS:g} ms: {'met' if added <= EMBEDDINGS_ADDED_TARGET_MS else 'MISSED'}",
        f"{streams} streams on {streams} slots: {ratio:.2f}× one slot, target ≥ {THROUGHPUT_TARGET:g}×: "
        f"{'met' if ratio >= THROUGHPUT_TARGET else 'MISSED'}",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--embeddings", type=int, default=200, help="embeddings requests per side")
    parser.add_argument("--blocks", type=int, default=4, help="alternating idle/busy blocks they are split into")
    parser.add_argument("--single-slot-rounds", type=int, default=5, help="embeddings requests behind a job, one group")
    parser.add_argument("--streams", type=int, default=STREAMS, help="concurrent streams, and the stand-in's slots")
    parser.add_argument("--tokens", type=int, default=STREAM_TOKENS, help="tokens per stream in the slot rounds")
    parser.add_argument("--tps", type=float, default=JOB_TPS, help="the stand-in's tokens per second in the slot rounds")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of the slot and CPU measurements")
    parser.add_argument("--cpu-tokens", type=int, default=10_000, help="tokens per stream for CPU per chunk")
    args = parser.parse_args(argv)

    load_before = load_average()
    embeddings = measure_embeddings(args.embeddings, args.blocks, args.single_slot_rounds)
    slots = measure_slots(args.streams, args.tokens, args.tps, args.rounds, args.cpu_tokens)
    print(f"machine: {machine()}")
    print(f"load average (1/5/15 min) before: {load_before}, after: {load_average()}")
    print(f"command: .venv/bin/python bench/slots.py --embeddings {args.embeddings} --blocks {args.blocks} "
          f"--single-slot-rounds {args.single_slot_rounds} --streams {args.streams} --tokens {args.tokens} "
          f"--tps {args.tps:g} --rounds {args.rounds} --cpu-tokens {args.cpu_tokens}")
    print()
    print("\n".join(embeddings_table(embeddings)))
    print()
    print("\n".join(slots_table(slots, args.streams, args.tokens, args.tps)))
    print()
    print("\n".join(cpu_table(slots, args.streams, args.tps)))
    print()
    print("\n".join(verdicts(embeddings, slots, args.streams)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
