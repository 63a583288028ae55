"""The two inputs every scheduler works from: a waiting request and a model's limits."""

from __future__ import annotations

from dataclasses import dataclass

from .placement import MemoryNeed


@dataclass(frozen=True)
class Ticket:
    """One request waiting for the GPU. `arrival` is monotonic seconds at submit; ids are
    unique positive integers chosen by the caller. `key` names the API key row it came with (None:
    a config file apiKey or none, which count as one key), `weight` that key's fair-share weight."""

    id: int
    model: str
    priority: int
    arrival: float
    key: str | None = None
    weight: int = 1

    def __post_init__(self) -> None:
        if self.weight < 1:
            raise ValueError(f"ticket #{self.id}: weight {self.weight} is below 1 — a key's weight is 1 or more")


@dataclass(frozen=True)
class ModelSpec:
    """What the schedulers need from a model's config."""

    id: str
    ttl: float = 0.0  # idle seconds before unload, 0 = never
    concurrency_limit: int = 10
    fifo_priority: int = 0
    memory: MemoryNeed | None = None  # with `hardware:` described: what it takes on each GPU it uses
    pinned: bool = False  # never stopped to make room for another model
    min_residency: float = 0.0  # seconds after it is ready before it may be stopped to make room

    def __post_init__(self) -> None:
        if self.ttl < 0:
            raise ValueError(f"model {self.id!r}: ttl {self.ttl} is negative — use 0 to never unload, or idle seconds")
        if self.concurrency_limit < 1:
            raise ValueError(
                f"model {self.id!r}: concurrency limit {self.concurrency_limit} is below 1 — "
                "use at least 1 (llama-swap's default is 10)"
            )
