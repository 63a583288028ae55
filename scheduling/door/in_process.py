"""The front door of a scheduler that runs in this process: direct calls on the runtime.

The request path calls the runtime as is (it runs on the event loop already), and so does `ask`.
`ask_now` comes from the admin's worker threads, so the question is answered on the loop, between
two scheduling steps, while the thread waits for the answer.
"""

from __future__ import annotations

import inspect
import time
from typing import Any

from scheduling.door.frontdoor import Unanswered
from scheduling.door.questions import BeginRelayed, EndRelayed, Question, RefuseKey, answer
from scheduling.runtime import SchedulerRuntime
from scheduling.tickets import Lease, Outcome, TicketRequest


class InProcessFrontDoor:
    runs_scheduler = True

    def __init__(self, runtime: SchedulerRuntime, fleet, config) -> None:
        self.runtime = runtime
        self.fleet = fleet
        self.config = config

    async def submit(self, request: TicketRequest, queued=None) -> Lease:
        return await self.runtime.submit(request, queued)

    def release(self, ticket_id: int, outcome: Outcome) -> None:
        self.runtime.release(ticket_id, outcome)

    async def begin_relayed(self, request: TicketRequest, peer: str, explanation: str) -> int:
        return await self.ask(BeginRelayed(request, peer, time.time(), explanation))

    def end_relayed(self, ticket_id: int | None, request: TicketRequest, outcome: Outcome, seconds: float,
                    first_byte_s: float | None) -> None:
        if ticket_id is not None:
            answer(EndRelayed(ticket_id, outcome, seconds, first_byte_s), self.runtime, self.fleet)

    async def refuse_key(self, key: str, why: str) -> int:
        return len(await self.ask(RefuseKey(key, why)))

    async def ask(self, question: Question) -> Any:
        answered = answer(question, self.runtime, self.fleet)
        return await answered if inspect.isawaitable(answered) else answered

    def ask_now(self, question: Question) -> Any:
        try:
            return self.runtime.operators.from_thread(answer, question, self.runtime, self.fleet)
        except TimeoutError:  # the loop is held up (a long scheduling step): the page says so
            raise Unanswered(f"the scheduler did not answer {type(question).__name__!r} in time") from None
        except RuntimeError as exc:  # its loop has ended: this process is shutting down
            raise Unanswered(f"the scheduler is not running ({exc})") from None

    async def close(self) -> None:
        """Nothing to stop: the composition root shuts the runtime and the fleet down."""
