"""What a fault run leaves behind, as plain data the checker judges: the clients' answers, the
faults and when they held, the stand-in models' events and the request rows.

Every time is seconds since the epoch (`time.time()`), the clock the fake models' events and
PostgreSQL's timestamps share on one machine, so the three records line up.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Answer:
    """One client's request and what it got back.

    `address` is the loopback address the client connected from (127.1.x.y, one per request): the
    row's `client` column, so each row is tied to the request that made it."""

    id: str  # the fake model's request id (`fake.id`)
    address: str
    front_end: str  # the process it was sent to
    priority: int
    stream: bool
    tokens: int  # how many the model was asked for
    sent_at: float
    leaves_after: float | None = None  # the client gives up this long after sending (or after its first bytes)
    left_at: float | None = None  # when it did give up
    status: int | None = None  # None: no answer (the connection failed, or the client left first)
    ticket: int | None = None  # X-LlamaSwap-Request-Id
    first_byte_at: float | None = None
    ended_at: float | None = None
    tokens_got: int = 0  # content chunks of a stream; completion_tokens of a whole answer
    complete: bool = False  # a whole answer, or a stream that reached [DONE] without an error event
    error: str = ""  # the transport error or the stream's error event, as the client saw it


@dataclass(frozen=True)
class Fault:
    """One fault while it held. `kind`: "cut", "stall", "delay" (a relay on `path` of `process`)
    or "kill" (`process` died: kill -9, or a worker that shut itself down on losing its lock; it ends
    once the process, or its replacement, serves again)."""

    kind: str
    process: str
    path: str  # "postgres", "redis", or "process" for a kill
    start: float
    end: float

    def overlaps(self, start: float, end: float) -> bool:
        return self.start <= end and start <= self.end


@dataclass(frozen=True)
class Row:
    """The columns of one scheduling_queuedrequest row the checker reads."""

    id: int
    client: str
    state: str
    status_code: int | None
    output_tokens: int | None
    priority: int
    arrived_at: float
    dispatched_at: float | None = None
    error: str = ""


@dataclass(frozen=True)
class ModelEvent:
    """One line of a fake model's --events file: "start", "end", "disconnect" of request `id`."""

    event: str
    id: str
    t: float


@dataclass
class History:
    answers: list[Answer]
    faults: list[Fault]
    events: list[ModelEvent]
    rows: list[Row]
    # The processes whose death cuts a request's bytes, beyond its own front end (a worker's
    # model servers stop when another worker takes over).
    byte_path_processes: frozenset[str] = frozenset()
    # How long the service may take to learn that a client left, in quiet times.
    leave_grace_s: float = 1.5
    # How long a worker waits before it takes a silent front end for dead.
    front_end_silence_s: float = 5.0
    notes: list[str] = field(default_factory=list)
