"""The messages front ends and a scheduler worker exchange over the channel layer.

Each is a frozen dataclass; `to_message` turns one into the plain dict the channel layer carries
(its `type` names the handler, as Channels expects) and `from_message` turns it back, so both
sides speak in types and only this module knows the wire shape. Requests are named by a `key`
the front end makes (unique to it) until the worker has given them a ticket id; every message
about a request carries that key, so a grant and a cancel may cross on the wire safely.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from scheduling.core import Band, Decision, ScoreTerms
from scheduling.runtime import Outcome, TicketRequest

WORKER_CHANNEL = "llamaswap.worker"


@dataclass(frozen=True)
class Submit:
    """Front end → worker: queue this request; answer on `reply`."""

    key: str
    reply: str
    request: TicketRequest


@dataclass(frozen=True)
class Cancel:
    """Front end → worker: the client left; drop the request wherever it is."""

    key: str


@dataclass(frozen=True)
class Release:
    """Front end → worker: the granted request ended."""

    key: str
    outcome: Outcome


@dataclass(frozen=True)
class Granted:
    """Worker → front end: send the request to `upstream` now."""

    key: str
    ticket_id: int
    upstream: str
    decision: Decision


@dataclass(frozen=True)
class Refused:
    """Worker → front end: the scheduler answered with an error instead of a grant."""

    key: str
    status: int
    code: str
    message: str
    retry_after: float | None = None


@dataclass(frozen=True)
class Cut:
    """Worker → front end: the GPU was taken back mid-request (an operator unloaded the model)."""

    key: str
    status: int
    code: str
    message: str


Message = Submit | Cancel | Release | Granted | Refused | Cut
_TYPES: dict[str, type] = {
    "ticket.submit": Submit,
    "ticket.cancel": Cancel,
    "ticket.release": Release,
    "ticket.granted": Granted,
    "ticket.refused": Refused,
    "ticket.cut": Cut,
}
_NAMES = {cls: name for name, cls in _TYPES.items()}


def to_message(message: Message) -> dict[str, Any]:
    """The channel-layer dict for `message`: only str, int, float, bool, None, lists and dicts."""
    body = dataclasses.asdict(message)
    if isinstance(message, Granted):
        body["decision"]["band"] = str(message.decision.band)
    return {"type": _NAMES[type(message)], **body}


def from_message(body: dict[str, Any]) -> Message:
    """The typed message a channel-layer dict carries; ValueError for one this module does not know."""
    fields = {name: value for name, value in body.items() if name != "type"}
    cls = _TYPES.get(body.get("type", ""))
    if cls is None:
        raise ValueError(f"unknown message type {body.get('type')!r}")
    if cls is Submit:
        fields["request"] = TicketRequest(**fields["request"])
    elif cls is Release:
        fields["outcome"] = Outcome(**fields["outcome"])
    elif cls is Granted:
        decision = dict(fields["decision"])
        decision["band"] = Band(decision["band"])
        decision["terms"] = ScoreTerms(**decision["terms"])
        fields["decision"] = Decision(**decision)
    return cls(**fields)
