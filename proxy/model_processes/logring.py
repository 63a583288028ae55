"""A bounded in-memory log with live subscribers, one per model plus one for the proxy.

Model servers can print a lot; keeping only the most recent text bounds memory, and live
subscribers (`GET /logs/stream`) get new text without ever being able to slow the writer down.
"""

from __future__ import annotations

import asyncio
import codecs
import threading
import uuid
from collections import deque

DEFAULT_MAX_CHARS = 100_000
DEFAULT_SUBSCRIBER_BACKLOG = 1000


class LogRing:
    """Keeps the last `max_chars` characters of appended text and fans new text out to subscribers.

    `append` may be called from any thread; subscribers are asyncio queues fed on their own loop.
    A subscriber that falls `backlog` pieces behind loses its oldest unread pieces.
    """

    def __init__(self, max_chars: int = DEFAULT_MAX_CHARS, *, backlog: int = DEFAULT_SUBSCRIBER_BACKLOG):
        self.max_chars = max_chars
        self._backlog = backlog
        self._pieces: deque[str] = deque()
        self._size = 0
        # Positions for readers that poll: characters appended since the ring was made, and which ring.
        self._end = 0
        self._id = uuid.uuid4().hex
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._lock = threading.Lock()
        self._subscribers: dict[asyncio.Queue[str], asyncio.AbstractEventLoop] = {}

    def append(self, data: bytes | str) -> None:
        """Add output; bytes are decoded as UTF-8, even when a character is split across calls."""
        text = self._decoder.decode(data) if isinstance(data, bytes) else data
        if not text:
            return
        with self._lock:
            self._pieces.append(text)
            self._size += len(text)
            self._end += len(text)
            self._trim()
            subscribers = list(self._subscribers.items())
        for queue, loop in subscribers:
            self._deliver(queue, loop, text)

    def text(self) -> str:
        with self._lock:
            return "".join(self._pieces)

    def since(self, cursor: str | None) -> tuple[str, str]:
        """The text appended after `cursor` and the cursor to read from next, for a reader in another
        process that polls (a front end streaming a worker's logs). None, a cursor of another ring (the
        worker restarted) or one whose text was trimmed since reads all the text kept."""
        ring, _, position = (cursor or "").partition(":")
        with self._lock:
            wanted = min(self._size, self._end - int(position)) if ring == self._id else self._size
            parts = []
            for piece in reversed(self._pieces):
                if wanted <= 0:
                    break
                parts.append(piece[-wanted:])
                wanted -= len(piece)
            return "".join(reversed(parts)), f"{self._id}:{self._end}"

    def tail(self, lines: int) -> list[str]:
        """The last `lines` lines kept, without line endings."""
        if lines <= 0:
            return []
        return self.text().splitlines()[-lines:]

    def subscribe(self) -> asyncio.Queue[str]:
        """A queue that receives every piece of text appended from now on (call from the event loop)."""
        queue: asyncio.Queue[str] = asyncio.Queue(maxsize=self._backlog)
        with self._lock:
            self._subscribers[queue] = asyncio.get_running_loop()
        return queue

    def unsubscribe(self, queue: asyncio.Queue[str]) -> None:
        with self._lock:
            self._subscribers.pop(queue, None)

    def _trim(self) -> None:
        while self._size > self.max_chars:
            excess = self._size - self.max_chars
            oldest = self._pieces[0]
            if len(oldest) <= excess:
                self._pieces.popleft()
                self._size -= len(oldest)
            else:
                self._pieces[0] = oldest[excess:]
                self._size -= excess

    @staticmethod
    def _deliver(queue: asyncio.Queue[str], loop: asyncio.AbstractEventLoop, text: str) -> None:
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            _put_dropping_oldest(queue, text)
            return
        try:
            loop.call_soon_threadsafe(_put_dropping_oldest, queue, text)
        except RuntimeError:
            pass  # the subscriber's event loop is closed; nobody is listening any more


def _put_dropping_oldest(queue: asyncio.Queue[str], text: str) -> None:
    """Enqueue without ever waiting: a full queue forgets its oldest piece instead."""
    if queue.full():
        queue.get_nowait()
    queue.put_nowait(text)
