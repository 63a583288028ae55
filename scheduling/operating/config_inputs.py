"""What the scheduling core takes from a loaded config: each model's limits and the swap router.

Shared by the service, which builds its scheduler from them, and the replay, which builds one
like it to play recorded traffic through.
"""

from __future__ import annotations

from scheduling.core import MatrixPolicy, ModelSpec, SwapGroup, SwapPolicy

PLACEMENT_GROUP = "(placed by memory)"


def model_specs(config) -> dict[str, ModelSpec]:
    """What the scheduling core needs to know about each configured model."""
    return {
        model_id: ModelSpec(
            id=model_id,
            ttl=model.ttl,
            concurrency_limit=model.concurrency_limit,
            fifo_priority=config.scheduler.fifo_priority.get(model_id, 0),
            memory=model.memory,
            pinned=model.pinned,
            min_residency=model.min_residency,
        )
        for model_id, model in config.models.items()
    }


def swap_policy(config) -> SwapPolicy | MatrixPolicy:
    """The router the config chose: its matrix, or its groups; with `hardware:` described and neither, one group
    of every model that swaps nothing, so memory alone decides what runs together."""
    if config.matrix is not None:
        return config.matrix
    if config.hardware is not None and not config.groups:
        return SwapPolicy([SwapGroup(PLACEMENT_GROUP, tuple(config.models), swap=False, exclusive=False)], config.models)
    return SwapPolicy(config.groups, config.models)
