"""What the scheduling core takes from a loaded config: each model's limits and the swap router.

Shared by the service, which builds its scheduler from them, and the replay, which builds one
like it to play recorded traffic through.
"""

from __future__ import annotations

from scheduling.core import MatrixPolicy, ModelSpec, SwapPolicy


def model_specs(config) -> dict[str, ModelSpec]:
    """What the scheduling core needs to know about each configured model."""
    return {
        model_id: ModelSpec(
            id=model_id,
            ttl=model.ttl,
            concurrency_limit=model.concurrency_limit,
            fifo_priority=config.scheduler.fifo_priority.get(model_id, 0),
        )
        for model_id, model in config.models.items()
    }


def swap_policy(config) -> SwapPolicy | MatrixPolicy:
    """The router the config chose: its matrix, or its groups."""
    if config.matrix is not None:
        return config.matrix
    return SwapPolicy(config.groups, config.models)
