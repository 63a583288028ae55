"""`holding()` turns every way a request ends into one outcome, recorded once."""

from __future__ import annotations

import asyncio

import pytest

from proxy.serving.errors import ProxyError
from proxy.serving.holding import CLIENT_LEFT, holding, ticket_request
from scheduling.tickets import Outcome, Refused

SHUTDOWN = Refused(503, "shutting_down", "llamaswap shut down before this request finished")
DONE = Outcome(state="completed", status_code=200)


async def held_until(ending, cut: Refused | None = None, cancel: bool = False,
                     **options) -> tuple[list[Outcome], BaseException | None, object]:
    """Run `ending(held)` inside `holding()` in a task of its own, cancelled once it waits if `cancel`;
    (what was recorded, what escaped, the Held)."""
    recorded: list[Outcome] = []
    seen = {}

    async def serve():
        async with holding(recorded.append, lambda: cut, **options) as held:
            seen["held"] = held
            await ending(held)

    task = asyncio.get_running_loop().create_task(serve())
    await asyncio.sleep(0)
    if cancel:
        task.cancel()
    try:
        await task
        escaped = None
    except BaseException as exc:  # noqa: BLE001 - what escaped is the result
        escaped = exc
    return recorded, escaped, seen.get("held")


async def waits(held) -> None:
    await asyncio.Event().wait()


async def test_the_relays_end_is_recorded_once_though_the_block_ends_after_it():
    async def answered(held):
        held.end(DONE)

    recorded, escaped, _ = await held_until(answered)
    assert (recorded, escaped) == ([DONE], None)


async def test_a_proxy_error_ends_it_failed_with_its_status_and_is_raised_on():
    async def fails(held):
        raise ProxyError(504, "model 'm' did not answer in time", "upstream_timeout")

    recorded, escaped, _ = await held_until(fails)
    assert recorded == [Outcome(state="failed", status_code=504, error="model 'm' did not answer in time")]
    assert isinstance(escaped, ProxyError)


async def test_a_listed_failure_ends_it_failed_with_502_and_anything_else_as_the_client_leaving():
    async def refused(held):
        raise OSError("connection refused")

    recorded, escaped, _ = await held_until(refused, failures=(OSError,))
    assert recorded == [Outcome(state="failed", status_code=502, error="connection refused")]
    assert isinstance(escaped, OSError)
    recorded, _, _ = await held_until(refused)
    assert recorded == [CLIENT_LEFT]


async def test_an_operators_cut_is_recorded_as_cancelled_swallowed_and_left_for_the_caller_to_tell():
    recorded, escaped, held = await held_until(waits, cut=SHUTDOWN, cancel=True)
    assert recorded == [Outcome(state="cancelled", status_code=503, error=SHUTDOWN.message)]
    assert escaped is None and held.cut is SHUTDOWN


async def test_a_client_that_leaves_ends_it_as_left_and_the_cancellation_goes_on():
    socket_closed = Outcome(state="completed", status_code=101)
    recorded, escaped, held = await held_until(waits, cancel=True, left=lambda: socket_closed)
    assert recorded == [socket_closed]
    assert isinstance(escaped, asyncio.CancelledError) and held.cut is None


def test_a_request_is_built_from_its_scope_and_headers_once():
    scope = {"path": "/v1/chat/completions", "client": ("10.0.0.9", 5555)}
    request = ticket_request(scope, {"x-llamaswap-priority": "interactive", "x-llamaswap-max-wait": "30"},
                             model="m", requested="alias", method="POST", stream=True, selector="pick")
    assert (request.model, request.requested_model, request.client, request.route, request.stream) == (
        "m", "alias", "10.0.0.9", "/v1/chat/completions", True)
    assert request.priority > 0 and request.max_wait_s == 30 and request.selector == "pick"
    with pytest.raises(ProxyError) as refused:
        ticket_request(scope, {"x-llamaswap-max-wait": "soon"}, model="m", requested="m", method="POST")
    assert refused.value.status == 400
