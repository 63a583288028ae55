"""A selector's pick from the targets' process states and its own unfinished requests (no profiles here,
so no database): spillover's order of preference, its reservations, and its 503."""

from __future__ import annotations

import textwrap

import pytest

from proxy.config import parse_config
from proxy.serving.errors import ProxyError
from proxy.serving.model_choice import choose_model

CONFIG = """
models:
  a: {cmd: "srv --port ${PORT}"}
  b: {cmd: "srv --port ${PORT}", aliases: [bee]}
  c: {cmd: "srv --port ${PORT}"}
groups:
  all: {swap: false, members: [a, b, c]}
peers:
  box: {proxy: "http://10.0.0.2:8080", models: [far]}
selectors:
  spread: {strategy: spillover, targets: [a, bee, box/far], settings: {spillover: 2}}
  warm: {strategy: warm, targets: [a, b, c]}
  pin: {strategy: pin, targets: [c, a]}
"""


class Door:
    def __init__(self, states: dict[str, str]):
        self.states = states

    async def ask(self, question) -> dict[str, str]:  # only `Processes` is asked
        return dict(self.states)


class Service:
    def __init__(self, states: dict[str, str] | None = None):
        self.config = parse_config(textwrap.dedent(CONFIG))
        self.door = Door(states or {})


async def picks(service, count: int) -> list:
    return [await choose_model(service, "spread") for _ in range(count)]


async def test_spillover_fills_each_target_then_the_next_then_the_least_busy():
    service = Service()
    held = await picks(service, 6)
    # a to 2, then bee (b) to 2, then the peer model to 2
    assert [c.model for c in held] == ["a", "a", "bee", "bee", "box/far", "box/far"]
    assert all(c.selector == "spread" for c in held)
    # All full: the least busy takes the next one. a frees one, so a has fewest.
    held[0].release()
    held[0].release()  # idempotent
    assert (await choose_model(service, "spread")).model == "a"
    for choice in held:
        choice.release()


async def test_spillover_prefers_a_loaded_target_with_room_to_starting_another():
    service = Service({"b": "ready"})
    first = await choose_model(service, "spread")
    assert first.model == "bee"  # b runs and holds none of this selector's requests yet
    second = await choose_model(service, "spread")
    assert second.model == "bee"
    assert (await choose_model(service, "spread")).model == "a"  # b is full: start the first idle target
    first.release()
    second.release()


async def test_spillover_skips_a_stopping_target_and_answers_503_when_all_are_stopping():
    service = Service({"a": "stopping", "b": "stopping"})
    choice = await choose_model(service, "spread")
    assert choice.model == "box/far"
    choice.release()
    service.config = parse_config(textwrap.dedent(CONFIG.replace("[a, bee, box/far]", "[a, bee]")))
    with pytest.raises(ProxyError) as info:
        await choose_model(service, "spread")
    assert info.value.status == 503 and "stopping" in info.value.message


async def test_warm_takes_ready_then_starting_then_the_first():
    assert (await choose_model(Service({"a": "starting", "c": "ready"}), "warm")).model == "c"
    assert (await choose_model(Service({"b": "starting", "c": "stopping"}), "warm")).model == "b"
    assert (await choose_model(Service({"b": "stopping"}), "warm")).model == "a"


async def test_pin_and_plain_names():
    pinned = await choose_model(Service({"a": "ready"}), "pin")
    assert (pinned.model, pinned.selector, pinned.body_model) == ("c", "pin", "c")
    plain = await choose_model(Service(), "bee")
    assert (plain.model, plain.selector, plain.body_model) == ("bee", "", "")
