"""A body Twisted spooled to a file reaches the application a piece at a time: whatever daphne queued, the
application's queue never holds more than one piece of it, and the pieces are the body, in order."""

from __future__ import annotations

import asyncio
import io
import tempfile

from proxy.server.spooled_body import PIECE_BYTES, SpooledBody


async def test_the_body_is_read_from_the_file_one_piece_at_a_time():
    body = bytes(range(256)) * (PIECE_BYTES // 256 * 3 + 7)  # three whole pieces and a part
    content = tempfile.TemporaryFile()
    content.write(body)
    content.seek(0)
    queue: asyncio.Queue = asyncio.Queue()
    facade = SpooledBody(queue, content)
    while piece := content.read(8192):  # what daphne does: every piece at once
        facade.put_nowait({"type": "http.request", "body": piece, "more_body": True})
    received, most_queued = [], 0
    while True:
        await asyncio.sleep(0.01)  # an application slower than the feeder
        most_queued = max(most_queued, queue.qsize())
        message = await queue.get()
        received.append(message["body"])
        if not message["more_body"]:
            break
    assert b"".join(received) == body and len(received) == 4 and most_queued == 1


async def test_a_disconnect_passes_at_once_and_a_small_body_is_left_to_daphne():
    queue: asyncio.Queue = asyncio.Queue()
    SpooledBody(queue, tempfile.TemporaryFile()).put_nowait({"type": "http.disconnect"})
    assert queue.get_nowait() == {"type": "http.disconnect"}
    assert not SpooledBody.applies_to(io.BytesIO(b"small")) and SpooledBody.applies_to(tempfile.TemporaryFile())
