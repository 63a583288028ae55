"""Small helpers to drive a scheduler the way the runtime does, without a runtime."""

from scheduling.core import Dequeued, Grant, ModelSpec, Refuse, StartModel, StopModel, SwapGroup, SwapPolicy, Ticket


def specs(*ids, **overrides) -> dict[str, ModelSpec]:
    """ModelSpecs for `ids`; overrides maps a model id to ModelSpec keyword arguments."""
    return {model: ModelSpec(model, **overrides.get(model, {})) for model in ids}


def one_at_a_time(*ids) -> SwapPolicy:
    return SwapPolicy([], ids)


def policy_within(groups, models) -> SwapPolicy:
    """`groups` limited to the models a config defines; groups left without members are dropped."""
    kept = []
    for group in groups:
        members = tuple(m for m in group.members if m in models)
        if members:
            kept.append(SwapGroup(group.name, members, group.swap, group.exclusive, group.persistent))
    return SwapPolicy(kept, models)


def grants(effects) -> list[int]:
    return [e.ticket_id for e in effects if isinstance(e, Grant)]


def grant_of(effects) -> Grant:
    (grant,) = [e for e in effects if isinstance(e, Grant)]
    return grant


def starts(effects) -> list[StartModel]:
    return [e for e in effects if isinstance(e, StartModel)]


def stops(effects) -> list[StopModel]:
    return [e for e in effects if isinstance(e, StopModel)]


def refused_by(effects) -> dict[int, Refuse]:
    return {e.ticket_id: e for e in effects if isinstance(e, Refuse)}


def dequeued(effects) -> list[int]:
    return [e.ticket_id for e in effects if isinstance(e, Dequeued)]


class Tickets:
    """Hands out tickets with increasing ids."""

    def __init__(self) -> None:
        self.next_id = 1

    def __call__(self, model: str, priority: int = 0, arrival: float = 0.0) -> Ticket:
        ticket = Ticket(self.next_id, model, priority, arrival)
        self.next_id += 1
        return ticket
