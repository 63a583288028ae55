"""The clients of a fault run: requests of mixed priorities, streaming and not, some clients
leaving early, each sent from a loopback address of its own so its row can be found by `client`."""

from __future__ import annotations

import json
import random
import threading
import time

import httpx

from tests.faults.cluster import MODEL
from tests.faults.history import Answer

PRIORITIES = (-50, 0, 0, 5, 20)
PATIENCE_S = 180.0  # a client that does not leave waits this long for its answer


def plan(seed: int, count: int, seconds: float, front_ends: list[str]) -> list[tuple[float, Answer]]:
    """`count` requests spread over `seconds`, in bursts so that a queue builds: (send at, answer)."""
    rng = random.Random(seed)
    planned = []
    at = 0.0
    for number in range(count):
        at += rng.expovariate(count / seconds) * (0.2 if rng.random() < 0.5 else 1.8)
        leaves = rng.random() < 0.12
        answer = Answer(
            id=f"r{number:04d}", address=f"127.1.{number // 250}.{number % 250 + 1}",
            front_end=rng.choice(front_ends), priority=rng.choice(PRIORITIES), stream=rng.random() < 0.5,
            tokens=rng.randint(2, 30), sent_at=0.0, leaves_after=rng.uniform(0.05, 1.5) if leaves else None,
        )
        planned.append((min(at, seconds), answer))
    return planned


def send(answer: Answer, base: str) -> None:
    """Send one request and fill `answer` with what its client saw (never raises)."""
    patience = answer.leaves_after if answer.leaves_after is not None else PATIENCE_S
    transport = httpx.HTTPTransport(local_address=answer.address)
    body = {"model": MODEL, "stream": answer.stream, "messages": [{"role": "user", "content": answer.id}],
            "fake": {"id": answer.id, "tokens": answer.tokens, "tps": 100}}
    headers = {"X-LlamaSwap-Priority": str(answer.priority)}
    answer.sent_at = time.time()
    try:
        with httpx.Client(transport=transport, timeout=httpx.Timeout(patience, connect=10)) as client:
            with client.stream("POST", base + "/v1/chat/completions", json=body, headers=headers) as response:
                answer.status = response.status_code
                ticket = response.headers.get("x-llamaswap-request-id")
                answer.ticket = int(ticket) if ticket else None
                if answer.stream and response.status_code == 200:
                    _read_stream(answer, response)
                else:
                    _read_whole(answer, response)
    except httpx.TimeoutException as exc:
        if answer.leaves_after is not None:
            answer.left_at = time.time()
        else:
            answer.error = f"gave up after {PATIENCE_S} s: {exc!r}"
    except httpx.HTTPError as exc:
        answer.error = repr(exc)
    answer.ended_at = time.time()


def _read_whole(answer: Answer, response: httpx.Response) -> None:
    raw = response.read()
    answer.first_byte_at = time.time()
    if response.status_code != 200:
        answer.error = _said(raw)
        return
    usage = json.loads(raw).get("usage") or {}
    answer.tokens_got = usage.get("completion_tokens", 0)
    answer.complete = answer.tokens_got == answer.tokens


def _said(raw: bytes) -> str:
    """An error answer as "code: message" (the code first, so a shortened one keeps it), else its text."""
    try:
        error = json.loads(raw)["error"]
        return f"{error.get('code')}: {error.get('message')}"[:300]
    except (ValueError, KeyError, TypeError, AttributeError):
        return raw.decode(errors="replace")[:300]


def _read_stream(answer: Answer, response: httpx.Response) -> None:
    for line in response.iter_lines():
        if not line.startswith("data: "):
            continue
        if answer.first_byte_at is None:
            answer.first_byte_at = time.time()
        payload = line[len("data: "):]
        if payload == "[DONE]":
            answer.complete = not answer.error and answer.tokens_got == answer.tokens
            return
        chunk = json.loads(payload)
        if "error" in chunk:
            answer.error = _said(json.dumps(chunk).encode())
            continue
        if any((choice.get("delta") or {}).get("content") for choice in chunk.get("choices") or []):
            answer.tokens_got += 1
        if answer.leaves_after is not None and time.time() - answer.sent_at > answer.leaves_after:
            answer.left_at = time.time()  # the client closes the stream mid-way
            return


class Clients:
    """Sends the planned requests on time, each on a thread, and waits for them all."""

    def __init__(self, planned: list[tuple[float, Answer]], base_of) -> None:
        self.planned = planned
        self.base_of = base_of  # front end name -> its base URL
        self.threads: list[threading.Thread] = []
        self._runner = threading.Thread(target=self._run, name="clients", daemon=True)

    def start(self) -> Clients:
        self._runner.start()
        return self

    def _run(self) -> None:
        began = time.monotonic()
        for at, answer in self.planned:
            pause = began + at - time.monotonic()
            if pause > 0:
                time.sleep(pause)  # the workload's own schedule
            thread = threading.Thread(target=send, args=(answer, self.base_of(answer.front_end)), daemon=True)
            thread.start()
            self.threads.append(thread)

    def wait_sent(self, timeout: float) -> None:
        self._runner.join(timeout)

    def join(self, timeout: float) -> list[str]:
        """Waits until every client has its answer (or `timeout`); returns the ids still waiting."""
        deadline = time.monotonic() + timeout
        self._runner.join(max(0.0, deadline - time.monotonic()))
        for thread in list(self.threads):
            thread.join(max(0.0, deadline - time.monotonic()))
        return [answer.id for _, answer in self.planned if answer.ended_at is None]
