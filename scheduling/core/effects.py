"""What a scheduler asks its runtime to do. The core never acts; it only returns these."""

from __future__ import annotations

from dataclasses import dataclass

from .decision import Decision


@dataclass(frozen=True)
class Grant:
    """The request may go upstream now; the runtime reports its end with `finished`."""

    ticket_id: int
    model: str
    decision: Decision


@dataclass(frozen=True)
class StartModel:
    """Stop the evicted models (they are idle), then start `model`; answer with `model_ready` or
    `model_failed`. The evicted models count as stopped from this moment on: no `model_stopped`
    is expected for them."""

    model: str
    evict: tuple[str, ...]
    gpus: tuple[str, ...] | None = None  # with `hardware:` described: the GPUs it goes on (() on the CPU)
    for_memory: tuple[str, ...] = ()  # those of `evict` stopped for their memory (the others: the groups or matrix)


@dataclass(frozen=True)
class StopModel:
    """Stop `model` ("ttl", "unload", "evict", "reload" or "shutdown"); answer with `model_stopped`.

    Only "unload" and "shutdown" stop a model that is serving: an unload is immediate, so the
    runtime cuts those requests and reports each `finished`.

    If the stop cuts a start short, report that start's outcome (`model_failed`) before
    `model_stopped`, so it cannot be mistaken for the outcome of a later start.
    """

    model: str
    reason: str


@dataclass(frozen=True)
class Refuse:
    """Answer the waiting request with this error instead of a grant."""

    ticket_id: int
    status: int
    code: str
    message: str
    retry_after: float | None = None


@dataclass(frozen=True)
class Dequeued:
    """A cancelled request left the scheduler before being granted; nobody needs an answer."""

    ticket_id: int


Effect = Grant | StartModel | StopModel | Refuse | Dequeued
