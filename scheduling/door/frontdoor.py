"""The scheduler's front door: the one interface through which request consumers, the admin and
/metrics reach the scheduler, whichever process runs it.

The class that serves it is a setting, `LLAMASWAP_SCHEDULER_FRONT_DOOR` (a dotted path), the way
Django picks a session engine: the default, `scheduling.door.in_process.InProcessFrontDoor`, calls the
scheduler runtime on this process's event loop. The serving process builds its front door with
the service and installs it here; a process that serves nothing (a shell, `manage.py runserver`
for the admin) has none, and the pages that need the scheduler say so.

The request path is asynchronous and runs on the event loop. Everything else is a question
(`scheduling.door.questions`): `ask` on the event loop, `ask_now` from any other thread, because Django's
admin views run on worker threads.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from django.conf import settings
from django.utils.module_loading import import_string

from scheduling.door.questions import Question
from scheduling.tickets import Lease, Outcome, TicketRequest


class FrontDoor(Protocol):
    """What the rest of the service may ask of the scheduler: the request port, and `ask` for every
    question and operator command (`scheduling.door.questions`), answered alike whichever process runs it."""

    config: Any  # the config the scheduler runs with
    # Whether the scheduler runs in this process: the class is then built with (runtime, fleet,
    # config), else with (config, channel layer). Only the composition root (proxy.service) reads it.
    runs_scheduler: bool

    # -- the request path, on the event loop -----------------------------------------------------
    async def submit(self, request: TicketRequest, queued: Callable[[Any], None] | None = None) -> Lease:
        """Queue a request and wait for the GPU; raises `Refused`, or CancelledError if the caller
        leaves (the request is then cancelled). `queued` is given a handle for `Progress` once the
        request is queued."""

    def release(self, ticket_id: int, outcome: Outcome) -> None:
        """The granted request ended. Idempotent, so it is safe in `finally`."""

    async def begin_relayed(self, request: TicketRequest, peer: str, explanation: str) -> int | None:
        """A request served without the scheduler (relayed to a peer) begins now: its row and ticket id,
        or None when no row can be written (a front end that reaches no worker)."""

    def end_relayed(self, ticket_id: int | None, request: TicketRequest, outcome: Outcome, seconds: float,
                    first_byte_s: float | None) -> None:
        """A relayed request ended `seconds` after it began: its row and metrics. Idempotent."""

    async def refuse_key(self, key: str, why: str) -> int:
        """Refuse every request of the API key `key` still waiting for the GPU with 401 `invalid_api_key` saying
        `why` (the key stopped counting), at once, whether or not the scheduler can be reached now: a scheduler
        out of reach is told once it can be, and writes their rows then. Returns how many were refused here.
        Running requests go on."""

    # -- questions --------------------------------------------------------------------------------
    async def ask(self, question: Question) -> Any:
        """The answer to `question`, on the event loop; `Unanswered` when the scheduler did not or could not
        answer, and nothing else for that."""

    def ask_now(self, question: Question) -> Any:
        """`ask` from any thread but the event loop's (Django's admin views run on worker threads)."""

    async def close(self) -> None:
        """Stop serving; requests still waiting are refused."""


class Unanswered(Exception):
    """The scheduler did not or could not answer a question: its worker is out of reach (Redis away, none up),
    it did not answer in time, or answering failed there. The one failure `ask` and `ask_now` raise; the
    service goes on, and a caller says so (an HTTP route: 503 with `Retry-After`) or asks again later."""

    retry_after_s = 1  # a worker is reached again about a second after Redis is back

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


class DatabaseAway(Unanswered):
    """The worker could not answer because its database is unreachable: a route says so as it does for its own
    rows (503 `database_unreachable`), not as the scheduler out of reach. `kind`: the failure's type."""

    def __init__(self, why: str, kind: str) -> None:
        super().__init__(why)
        self.kind = kind


class ConfigUnavailable(Exception):
    """No config can be shown: none is named, or the file is unusable (the message says which)."""


class NotServing(Exception):
    """A page needs the running scheduler, and this process has none."""


_installed: FrontDoor | None = None
_config_loader: Callable[[], Any] | None = None


def front_door_class() -> type:
    """The front-door class the settings name."""
    return import_string(settings.LLAMASWAP_SCHEDULER_FRONT_DOOR)


def install(door: FrontDoor | None) -> None:
    """Make `door` this process's front door (None: this process no longer serves)."""
    global _installed
    _installed = door


def installed() -> FrontDoor | None:
    """This process's front door, if it serves; safe from any thread."""
    return _installed


def required() -> FrontDoor:
    """This process's front door, or NotServing with what to do instead."""
    if _installed is None:
        raise NotServing(
            "the scheduler is not running in this process; open the admin of the `llamaswap serve` instance"
        )
    return _installed


def set_config_loader(loader: Callable[[], Any]) -> None:
    """How to read the config file in a process that does not serve; raises ConfigUnavailable."""
    global _config_loader
    _config_loader = loader


def current_config():
    """The config in force: the front door's, else the configured file's. Raises ConfigUnavailable."""
    if _installed is not None:
        return _installed.config
    if _config_loader is None:
        raise ConfigUnavailable("no config loader is registered in this process")
    return _config_loader()
