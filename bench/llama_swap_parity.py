"""What the features that follow llama-swap cost: peers, WebSockets, captures and the activity API.

    .venv/bin/python bench/llama_swap_parity.py [--requests 300] [--ws-messages 1000] [--ws-bulk 20]
                                                [--capture-streams 10] [--activity-rows 1000000]

Four measurements, each against a real `llamaswap serve` with the fake model (`--tps 0`, so what remains is
the proxy). On a shared machine absolute times drift; every comparison runs its sides in one alternating
rotation (`timed_rounds`), and what is reported is the per-round difference or ratio:

- Peer relay: a tiny chat to `<peer>/<model>` (a fake model server run as a peer, under `peers:`) against
  the same chat straight to that server, in one rotation with a local model through the scheduler
  against straight to the local model: the added latency of a relayed request beside a scheduled one.
- WebSocket passthrough: a 100-byte text message's round trip over `/upstream/<model>/ws`
  (`compat.ignoreWebsockets: false`, the socket opened once) against over the fake model's own echo
  socket; then 1 MiB binary messages echoed, in MiB/s counting the bytes both ways.
- Captures: two services alike but for `captureBuffer: 64`, tiny chats and then 2000-token streams
  alternating between them.
- llama-swap's activity API on N ended rows in SQLite (written by bench/overview_page.py's `fill`, then
  given status, token counts and speeds): the first page in id order and by `sort=gen_speed`, and
  `/api/metrics/stats`, seconds per call, median of 3.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import httpx
import websocket  # websocket-client: a client independent of the passthrough it measures
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (  # noqa: E402
    CHAT, MODEL, REPO, added, chat_call, direct_base, load_average, machine, stats, timed_rounds,
)
from bench.streaming import stream_once  # noqa: E402
from tests.served import Served, fake_cmd, model_ports, wait_until  # noqa: E402

PEER = "box"
PEER_MODEL = "remote"
ECHO_MODEL = "echo"
CAPTURE_MB = 64
SERIAL = {"scheduler": {"use": "serial"}}
STREAM_TOKENS = 2000
MESSAGE = "x" * 100
BULK = bytes(range(256)) * 4096  # 1 MiB
ACTIVITY_CALLS = 3
ACTIVITY_ROUTES = {  # label: (path, query)
    "`/api/metrics/activity`, first page": ("/api/metrics/activity", {}),
    "`/api/metrics/activity?sort=gen_speed`, first page": ("/api/metrics/activity", {"sort": "gen_speed"}),
    "`/api/metrics/stats`": ("/api/metrics/stats", {}),
}
# What the recorder adds to an ended row that the Overview's rows leave out: a status, token counts and
# speeds, spread by id so the sort and the histograms have every value to order and bin.
TOKENS_SQL = """
    UPDATE scheduling_queuedrequest SET status_code = 200, input_tokens = 50 + id % 4000,
        output_tokens = 10 + id * 7 % 1000, cache_tokens = id * 13 % 2000,
        prompt_per_second = 100 + id * 31 % 2000, tokens_per_second = 5 + (id * 17 % 1000) / 10.0
    WHERE state = 'completed'
"""


def config_text(models: dict[str, dict], **top) -> str:
    """A config with these fake models at `--tps 0` (each name: its extra keys) and these top-level keys."""
    entries = {name: {"cmd": fake_cmd(name, None, "--tps", "0"), "proxy": "http://127.0.0.1:${PORT}", **extra}
               for name, extra in models.items()}
    return yaml.safe_dump({"healthCheckTimeout": 15, **top, "models": entries}, sort_keys=False)


@contextmanager
def fake_server(name: str) -> Iterator[str]:
    """The fake model server run on its own, as another machine's server would be; yields its base URL."""
    port = model_ports(1)
    process = subprocess.Popen(fake_cmd(name, None, "--tps", "0").replace("${PORT}", str(port)).split(), cwd=REPO,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        try:
            return httpx.get(base + "/health", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until(healthy, 30, 0.02, f"the fake server {name} to answer /health")
        yield base
    finally:
        process.terminate()
        process.wait(10)


# -- peer relay --------------------------------------------------------------------------------

def measure_relay(requests: int) -> dict[str, list[float]]:
    """Milliseconds per tiny chat: the peer and the local model, each straight and through llamaswap."""
    with tempfile.TemporaryDirectory(prefix="llamaswap-bench-") as tmp, fake_server(PEER_MODEL) as peer:
        text = config_text({MODEL: {}}, routing=SERIAL, peers={PEER: {"proxy": peer, "models": [PEER_MODEL]}})
        with Served(Path(tmp), text) as served, httpx.Client(timeout=60) as client:
            chat_call(client, served.base)()  # loads the local model
            remote = {**CHAT, "model": PEER_MODEL}
            calls = {
                "peer, straight to it": chat_call(client, peer, remote),
                "peer, through llamaswap": chat_call(client, served.base, {**CHAT, "model": f"{PEER}/{PEER_MODEL}"}),
                "local model, straight to it": chat_call(client, direct_base(served.base)),
                "local model, through llamaswap": chat_call(client, served.base),
            }
            return timed_rounds(calls, requests, shift=2)


RELAY_BASELINES = {"peer, through llamaswap": "peer, straight to it",
                   "local model, through llamaswap": "local model, straight to it"}


def relay_table(samples: dict[str, list[float]]) -> list[str]:
    rounds = len(next(iter(samples.values())))
    return added_table(f"tiny chat, {rounds} rounds (peer `{PEER}/{PEER_MODEL}` relayed; local model "
                       "scheduled, serial)", samples, RELAY_BASELINES)


def added_table(title: str, samples: dict[str, list[float]], baselines: dict[str, str]) -> list[str]:
    """One row per target, in ms; a target with a baseline also shows the per-round difference to it."""
    lines = [f"| {title} | p50 ms | p99 | mean | added p50 | added p99 |", "|---|--:|--:|--:|--:|--:|"]
    for name, through in samples.items():
        summary = stats(through)
        cells = [f"{summary.p50:.2f}", f"{summary.p99:.2f}", f"{summary.mean:.2f}", "", ""]
        if name in baselines:
            extra = stats(added(through, samples[baselines[name]]))
            cells[3:] = [f"{extra.p50:+.2f}", f"{extra.p99:+.2f}"]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


# -- WebSocket passthrough ---------------------------------------------------------------------

@dataclass(frozen=True)
class WebSocketRun:
    round_trip: dict[str, list[float]]  # ms per 100-byte text message echoed
    bulk: dict[str, list[float]]  # ms per 1 MiB binary message echoed


def echo_call(socket: websocket.WebSocket, message: str | bytes) -> Callable[[], None]:
    def call() -> None:
        if isinstance(message, bytes):
            socket.send_binary(message)
        else:
            socket.send(message)
        if socket.recv() != message:
            raise RuntimeError("the echo socket answered something other than the message sent")
    return call


def ws_url(base: str, path: str) -> str:
    return base.replace("http://", "ws://", 1) + path


def measure_websocket(messages: int, bulk: int) -> WebSocketRun:
    with tempfile.TemporaryDirectory(prefix="llamaswap-bench-") as tmp:
        text = config_text({ECHO_MODEL: {"compat": {"ignoreWebsockets": False}}})
        with Served(Path(tmp), text) as served:
            # Opening it starts the model, which it then holds while open.
            through = websocket.create_connection(ws_url(served.base, f"/upstream/{ECHO_MODEL}/ws"), timeout=60)
            try:
                direct = websocket.create_connection(ws_url(direct_base(served.base), "/ws"), timeout=60)
                try:
                    sockets = {"straight to the model's socket": direct, "through llamaswap": through}
                    round_trip = timed_rounds({name: echo_call(s, MESSAGE) for name, s in sockets.items()}, messages)
                    big = timed_rounds({name: echo_call(s, BULK) for name, s in sockets.items()}, bulk, warmup=2)
                finally:
                    direct.close()
            finally:
                through.close()
    return WebSocketRun(round_trip, big)


def mib_per_s(ms: float) -> float:
    """A 1 MiB message sent and echoed back: 2 MiB moved."""
    return 2 * len(BULK) / 2**20 / (ms / 1000)


def websocket_tables(run: WebSocketRun) -> list[list[str]]:
    direct, through = run.round_trip
    small = added_table(f"WebSocket, {len(MESSAGE)}-byte text message echoed, socket opened once, "
                        f"{len(run.round_trip[direct])} rounds", run.round_trip, {through: direct})
    lines = [f"| WebSocket, 1 MiB binary message echoed, {len(run.bulk[direct])} rounds | MiB/s p50 (both ways) | min "
             "| ms p50 | of direct (p50 of per-round ratios) |", "|---|--:|--:|--:|--:|"]
    for name, samples in run.bulk.items():
        rates = [mib_per_s(ms) for ms in samples]
        share = "" if name == direct else f"{bulk_ratio(run):.2f}"
        lines.append(f"| {name} | {statistics.median(rates):,.0f} | {min(rates):,.0f} | "
                     f"{statistics.median(samples):.2f} | {share} |")
    return [small, lines]


def bulk_ratio(run: WebSocketRun) -> float:
    direct, through = run.bulk.values()
    return statistics.median(d / t for d, t in zip(direct, through, strict=True))


# -- captures ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class CaptureRun:
    chat: dict[str, list[float]]  # ms per tiny chat, without and with captures
    stream_s: dict[str, list[float]]  # seconds per 2000-token stream


WITHOUT = "without `captureBuffer`"
WITH = f"`captureBuffer: {CAPTURE_MB}`"


def measure_captures(requests: int, streams: int) -> CaptureRun:
    with tempfile.TemporaryDirectory(prefix="llamaswap-bench-") as tmp:
        for name in ("without", "with"):
            (Path(tmp) / name).mkdir()
        plain = config_text({MODEL: {}}, routing=SERIAL)
        capturing = config_text({MODEL: {}}, routing=SERIAL, captureBuffer=CAPTURE_MB)
        with Served(Path(tmp) / "without", plain) as without, Served(Path(tmp) / "with", capturing) as kept, \
                httpx.Client(timeout=300) as client:
            bases = {WITHOUT: without.base, WITH: kept.base}
            chat = timed_rounds({name: chat_call(client, base) for name, base in bases.items()}, requests)
            stream_s: dict[str, list[float]] = {name: [] for name in bases}
            for base in bases.values():
                stream_once(client, base, STREAM_TOKENS)
            for _ in range(streams):
                for name, base in bases.items():
                    stream_s[name].append(stream_once(client, base, STREAM_TOKENS).seconds)
            check_captured(client, without.base, False)
            check_captured(client, kept.base, True)
    return CaptureRun(chat, stream_s)


def check_captured(client: httpx.Client, base: str, kept: bool) -> None:
    """The comparison means something only if one service keeps captures and the other does not."""
    answer = client.post(base + "/v1/chat/completions", json=CHAT).raise_for_status()
    capture = f"{base}/api/captures/{answer.headers['x-llamaswap-request-id']}"
    if kept:
        wait_until(lambda: client.get(capture).status_code == 200, 10, 0.05, f"{capture} to answer 200")
    elif (found := client.get(capture).status_code) != 404:
        raise RuntimeError(f"{capture} answered {found} on a service without captureBuffer")


def stream_ratio(run: CaptureRun) -> float:
    """Median over rounds of with ÷ without: how much longer a stream takes while it is captured."""
    return statistics.median(w / o for w, o in zip(run.stream_s[WITH], run.stream_s[WITHOUT], strict=True))


def capture_tables(run: CaptureRun) -> list[list[str]]:
    chat = added_table(f"tiny chat, two services alike but for captures, {len(run.chat[WITHOUT])} rounds",
                       run.chat, {WITH: WITHOUT})
    lines = [f"| streamed chat of {STREAM_TOKENS:,} tokens, {len(run.stream_s[WITHOUT])} rounds | seconds p50 | max "
             "| with ÷ without (p50 of per-round ratios) |", "|---|--:|--:|--:|"]
    for name, seconds in run.stream_s.items():
        lines.append(f"| {name} | {statistics.median(seconds):.3f} | {max(seconds):.3f} | "
                     f"{'' if name == WITHOUT else f'{stream_ratio(run):.2f}'} |")
    return [chat, lines]


# -- the activity API on a large table -----------------------------------------------------------

@dataclass(frozen=True)
class ActivityRun:
    rows: int
    fill_s: float
    seconds: dict[str, list[float]]  # by route label, one sample per call


def fill_rows(rows: int) -> None:
    """In a process of its own (LLAMASWAP_DATA_DIR names the data dir): migrate, write `rows` ended rows."""
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    from bench.overview_page import fill

    call_command("migrate", interactive=False, verbosity=0)
    fill(rows, datetime.now(timezone.utc).replace(microsecond=0))
    with connection.cursor() as cursor:
        cursor.execute(TOKENS_SQL)
        cursor.execute("ANALYZE scheduling_queuedrequest")


def measure_activity(rows: int) -> ActivityRun:
    with tempfile.TemporaryDirectory(prefix="llamaswap-bench-") as tmp:  # the SQLite file: half a GB at 1M rows
        served = Served(Path(tmp), config_text({MODEL: {}}), env={"DATABASE_URL": ""})
        served.data_dir.mkdir()
        started = time.perf_counter()
        subprocess.run([sys.executable, __file__, "--fill-rows", str(rows)], cwd=REPO, check=True,
                       env={**served.env, "DJANGO_SETTINGS_MODULE": "llamaswap_site.settings"})
        fill_s = time.perf_counter() - started
        seconds: dict[str, list[float]] = {label: [] for label in ACTIVITY_ROUTES}
        with served, httpx.Client(base_url=served.base, timeout=600) as client:
            for _ in range(ACTIVITY_CALLS):
                for label, (path, query) in ACTIVITY_ROUTES.items():
                    began = time.perf_counter()
                    response = client.get(path, params=query)
                    seconds[label].append(time.perf_counter() - began)
                    if response.status_code != 200:
                        raise RuntimeError(f"{path}: HTTP {response.status_code}: {response.text[:300]}")
                    if path.endswith("activity") and response.json()["total"] != rows:
                        raise RuntimeError(f"{path} counted {response.json()['total']} ended rows, not {rows}")
    return ActivityRun(rows, fill_s, seconds)


def activity_table(run: ActivityRun) -> list[str]:
    lines = [f"| llama-swap's activity API, {run.rows:,} ended rows (SQLite), {ACTIVITY_CALLS} calls each "
             "| seconds p50 | max |", "|---|--:|--:|"]
    for label, seconds in run.seconds.items():
        lines.append(f"| {label} | {statistics.median(seconds):.3f} | {max(seconds):.3f} |")
    return lines


# -- all four ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Parity:
    relay: dict[str, list[float]]
    websocket: WebSocketRun
    captures: CaptureRun
    activity: ActivityRun


def measure(requests: int, ws_messages: int, ws_bulk: int, capture_streams: int, activity_rows: int) -> Parity:
    return Parity(measure_relay(requests), measure_websocket(ws_messages, ws_bulk),
                  measure_captures(requests, capture_streams), measure_activity(activity_rows))


def tables(run: Parity) -> list[list[str] | str]:
    """One table per measure (two for WebSockets and for captures), in the order they ran."""
    return [relay_table(run.relay), *websocket_tables(run.websocket), *capture_tables(run.captures),
            f"{run.activity.rows:,} rows written (bench/overview_page.py's `fill`, then status, tokens and speeds) "
            f"in {run.activity.fill_s:.1f} s.", activity_table(run.activity)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300, help="rounds of tiny chats (peer relay, captures)")
    parser.add_argument("--ws-messages", type=int, default=1000, help="rounds of 100-byte WebSocket messages")
    parser.add_argument("--ws-bulk", type=int, default=20, help="rounds of 1 MiB WebSocket messages")
    parser.add_argument("--capture-streams", type=int, default=10, help=f"rounds of {STREAM_TOKENS}-token streams")
    parser.add_argument("--activity-rows", type=int, default=1_000_000, help="ended rows the activity API reads")
    parser.add_argument("--fill-rows", type=int, help=argparse.SUPPRESS)  # the activity measure's filling process
    args = parser.parse_args(argv)
    if args.fill_rows is not None:
        fill_rows(args.fill_rows)
        return 0

    load_before = load_average()
    run = measure(args.requests, args.ws_messages, args.ws_bulk, args.capture_streams, args.activity_rows)
    print(f"machine: {machine()}")
    print(f"load average (1/5/15 min) before: {load_before}, after: {load_average()}")
    print(f"command: .venv/bin/python bench/llama_swap_parity.py --requests {args.requests} --ws-messages "
          f"{args.ws_messages} --ws-bulk {args.ws_bulk} --capture-streams {args.capture_streams} "
          f"--activity-rows {args.activity_rows}")
    for block in tables(run):
        print()
        print(block if isinstance(block, str) else "\n".join(block))
    return 0


if __name__ == "__main__":
    sys.exit(main())
