"""The errors a waiting request can receive, worded once for both schedulers."""

from __future__ import annotations

from .effects import Refuse


def unknown_model(ticket_id: int, model: str) -> Refuse:
    return Refuse(ticket_id, 404, "model_not_found", f"model {model!r} is not configured on this server")


def over_concurrency_limit(ticket_id: int, model: str, limit: int) -> Refuse:
    return Refuse(
        ticket_id,
        429,
        "concurrency_limit",
        f"model {model!r} already has {limit} request{'' if limit == 1 else 's'} admitted (its concurrencyLimit); "
        "retry shortly",
        retry_after=1.0,
    )


def start_failed(ticket_id: int, model: str, reason: str) -> Refuse:
    return Refuse(ticket_id, 503, "model_start_failed", f"model {model!r} failed to start: {reason}")


def never_fits(ticket_id: int, why: str) -> Refuse:
    return Refuse(ticket_id, 503, "model_too_large", why)


def unloaded(ticket_id: int, model: str) -> Refuse:
    return Refuse(
        ticket_id, 503, "model_unloaded", f"model {model!r} was unloaded while this request waited for it; retry"
    )


def removed(ticket_id: int, model: str) -> Refuse:
    return Refuse(ticket_id, 404, "model_removed", f"model {model!r} was removed from the config by a reload")


def shutting_down(ticket_id: int) -> Refuse:
    return Refuse(ticket_id, 503, "shutting_down", "the server is shutting down; retry once it is back")
