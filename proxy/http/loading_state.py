"""llama-swap's `sendLoadingState`: a streaming chat client is told how its wait goes.

Clients such as Open WebUI show `delta.reasoning_content` as "thinking", so while the request
waits, and while its model loads, the stream carries one line per change in where it stands:
its place in the queue, the predicted wait and what it waits for (from the forecast), at most
once a second. Then the real answer follows on the same stream. A request granted at once gets no
loading state at all, and a client that leaves while waiting is cancelled as any other.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable

from scheduling.door.frontdoor import Unanswered
from scheduling.door.questions import Progress
from scheduling.keys.scope import KeyScope
from scheduling.tickets import Lease, TicketRequest

LOADING_ROUTE = "/v1/chat/completions"
# A grant within this long streams nothing extra: the client sees the answer as if nothing waited.
GRACE_S = 0.25
UPDATE_EVERY_S = 1.0
# While the line stays the same (no history, a long job ahead), an SSE comment this often keeps
# proxies and clients with read timeouts from cutting the stream.
KEEPALIVE_S = 15.0


def shows_loading_state(model_cfg, path: str, stream: bool) -> bool:
    return stream and path == LOADING_ROUTE and model_cfg.send_loading_state


def reasoning_chunk(model: str, text: str, ticket_id: int | None) -> bytes:
    """One OpenAI chat.completion.chunk whose delta is `text` as reasoning."""
    chunk = {
        "id": f"llamaswap-loading-{ticket_id or 0}",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "delta": {"role": "assistant", "reasoning_content": text}, "finish_reason": None}],
    }
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


async def wait_showing_state(
    consumer, door, request: TicketRequest, stream_headers: Callable[[int | None], list[tuple[bytes, bytes]]],
    viewer: KeyScope,
) -> Lease:
    """`door.submit(request)`, streaming progress to `consumer` once the wait outlasts `GRACE_S`, as the request's
    key (`viewer`) is told it. `stream_headers(ticket_id)` gives the headers to begin the stream with. Raises what
    submit raises; once the stream has begun, the caller must report a refusal inside it."""
    handle: list = []
    submitted = asyncio.get_running_loop().create_task(door.submit(request, handle.append))
    began = time.monotonic()
    try:
        await asyncio.wait([submitted], timeout=GRACE_S)
        last, ticket_id, sent_at = None, None, time.monotonic()

        async def say(text: str) -> None:
            nonlocal sent_at
            await consumer.send_body(reasoning_chunk(request.requested_model, text, ticket_id), more_body=True)
            sent_at = time.monotonic()

        while not submitted.done():
            entry = await _progress(door, handle)
            ticket_id = ticket_id or (entry and entry.ticket_id)
            if not consumer.response_started:
                await consumer.send_headers(status=200, headers=stream_headers(ticket_id))
                await say(f"Waiting for {request.model}…\n")
            if entry is not None and entry.outlook != last:
                last = entry.outlook
                await say(viewer.told(last) + "\n")
            elif time.monotonic() - sent_at >= KEEPALIVE_S:
                await consumer.send_body(b": still waiting\n\n", more_body=True)
                sent_at = time.monotonic()
            await asyncio.wait([submitted], timeout=UPDATE_EVERY_S)
        lease = submitted.result()
        if consumer.response_started:
            await say(f"Done! Sent to {request.model} after {time.monotonic() - began:.1f} s.\n\n")
        return lease
    finally:
        if not submitted.done():  # the client left: cancelling the submit cancels the request
            submitted.cancel()
            with contextlib.suppress(BaseException):
                await submitted


async def _progress(door, handle: list):
    """Where the request stands, or None while it has no handle yet or the scheduler did not say."""
    if not handle:
        return None
    try:
        return await door.ask(Progress(handle[0]))
    except Unanswered:  # a worker out of reach or slow to answer: the next update tries again
        return None
