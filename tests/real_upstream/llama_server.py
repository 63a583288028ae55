"""A `llama-server` stand-in built on the xllamacpp wheel, so a config's `cmd:` can start real llama.cpp.

    python tests/real_upstream/llama_server.py -m MODEL.gguf --port ${PORT} -a NAME

xllamacpp embeds llama.cpp's own HTTP server (the code behind `llama-server`); this only maps the
familiar flags onto its parameters and lives until SIGTERM/SIGINT, which is how llamaswap stops a
model. Unlike `llama-server`, the port opens only once the model is loaded.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Serve a GGUF model with llama.cpp's HTTP server (xllamacpp).")
    parser.add_argument("-m", "--model", type=Path, required=True, help="the .gguf file")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("-a", "--alias", action="append", default=[], help="model id in /v1/models (repeatable)")
    parser.add_argument("-c", "--ctx-size", type=int, default=0, help="context length; 0 = the model's own")
    parser.add_argument("-t", "--threads", type=int, default=1)
    parser.add_argument("-np", "--parallel", type=int, default=1, help="number of slots")
    args = parser.parse_args(argv)
    if not args.model.is_file():
        parser.error(f"model file not found: {args.model}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import xllamacpp  # after argument checks, so --help and usage errors work without the wheel

    params = xllamacpp.CommonParams()
    params.model.path = str(args.model)
    params.hostnames = [args.host]
    params.port = args.port
    params.n_ctx = args.ctx_size
    params.n_parallel = args.parallel
    params.cpuparams.n_threads = args.threads
    params.cpuparams_batch.n_threads = args.threads
    if args.alias:
        params.model_alias = set(args.alias)

    stopping = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stopping.set())

    server = xllamacpp.Server(params)  # returns once the model is loaded and the port accepts connections
    print(f"llama_server: {args.model.name} on {server.listening_address}", flush=True)
    stopping.wait()
    del server  # stops llama.cpp's HTTP and inference threads
    return 0


if __name__ == "__main__":
    sys.exit(main())
