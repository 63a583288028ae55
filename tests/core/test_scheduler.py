"""Choosing a scheduler by name, and the one interface both share."""

import inspect

import pytest

from scheduling.core import FifoScheduler, Scheduler, SerialScheduler, SerialSettings, build_scheduler

from .harness import one_at_a_time, specs


@pytest.mark.parametrize(("name", "cls"), [("serial", SerialScheduler), ("fifo", FifoScheduler)])
def test_build_scheduler_by_config_name(name, cls):
    scheduler = build_scheduler(name, specs("a"), one_at_a_time("a"), SerialSettings())
    assert isinstance(scheduler, cls) and scheduler.name == name


def test_unknown_scheduler_name_says_what_is_accepted():
    with pytest.raises(ValueError, match="unknown scheduler 'lifo' — use 'fifo' or 'serial'"):
        build_scheduler("lifo", specs("a"), one_at_a_time("a"), SerialSettings())


@pytest.mark.parametrize("cls", [SerialScheduler, FifoScheduler])
def test_both_schedulers_offer_the_whole_interface_with_the_same_signatures(cls):
    protocol_methods = {
        name: member
        for name, member in inspect.getmembers(Scheduler, inspect.isfunction)
        if not name.startswith("_")
    }
    assert len(protocol_methods) == 24
    for name, member in protocol_methods.items():
        assert list(inspect.signature(getattr(cls, name)).parameters) == list(
            inspect.signature(member).parameters
        ), name
