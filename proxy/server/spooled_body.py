"""A request body Twisted spooled to a file, handed to the application a piece at a time as it reads them.

daphne puts a whole request body into the application's queue at once, in 8 KiB messages, so a 200 MB upload
would sit in memory until the application has read it. Bodies Twisted keeps in a file (any over 100 KB, or
sent chunked) go through `SpooledBody` instead: daphne's messages are let go, and the body is read again from
the file a piece at a time, the next piece only once the application has taken the one before."""

from __future__ import annotations

import asyncio
import io

PIECE_BYTES = 1024 * 1024
WAIT_S = 0.002  # how often a piece not yet taken is looked at again


class SpooledBody:
    """Stands in for the application's input queue where daphne puts a request's messages."""

    def __init__(self, queue: asyncio.Queue, content) -> None:
        self._queue = queue
        self._content = content
        self._feeding: asyncio.Task | None = None

    @staticmethod
    def applies_to(content) -> bool:
        return content is not None and not isinstance(content, io.BytesIO)

    def put_nowait(self, message: dict) -> None:
        if message.get("type") != "http.request":
            self._queue.put_nowait(message)  # http.disconnect: at once
        elif self._feeding is None:  # daphne's first piece: the body is read from the file from here on
            self._feeding = asyncio.ensure_future(self._feed())

    def __getattr__(self, name: str):
        return getattr(self._queue, name)

    async def _feed(self) -> None:
        offset = 0
        while True:
            while self._queue.qsize():
                await asyncio.sleep(WAIT_S)
            try:
                self._content.seek(offset)
                piece = self._content.read(PIECE_BYTES)
            except ValueError:  # the connection closed and took the file: daphne says http.disconnect
                return
            offset += len(piece)
            more = len(piece) == PIECE_BYTES
            self._queue.put_nowait({"type": "http.request", "body": piece, "more_body": more})
            if not more:
                return
