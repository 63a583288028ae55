"""`routing.router.settings.matrix` (or the legacy top-level `matrix`): `vars`, `evict_costs` and
`sets`, checked with every problem named by key path, and compiled into a `MatrixPolicy`."""

from __future__ import annotations

import re

from scheduling.core.matrix import MatrixPolicy, compile_sets

from .errors import kind_of
from .fields import MISSING, Section
from .model_index import ModelIndex

VAR_NAME = re.compile(r"[A-Za-z0-9.-]{1,32}")
SET_EXAMPLE = 'sets: {chat_and_tts: "(llm-a | llm-b) & tts"}'


def read_matrix(matrix: Section, index: ModelIndex) -> MatrixPolicy | None:
    """The matrix as a policy, or None when it has problems (they are in the log)."""
    problems_before = len(matrix.log.problems)
    variables = _read_vars(matrix.section("vars"), index)

    def resolve(name: str) -> str | None:
        # A var wins over a model ID of the same name, as in llama-swap.
        return variables[name] if name in variables else index.resolve(name)

    costs = _read_evict_costs(matrix.section("evict_costs"), resolve)
    sets = matrix.section("sets")
    definitions: dict[str, str] = {}
    unreadable: set[str] = set()  # sets whose value is already reported: parsing it would only repeat that
    if sets is None:
        if matrix.data.get("sets") is None:  # otherwise its type was reported
            matrix.error("sets", f"missing — name the model combinations that may run together, e.g. {SET_EXAMPLE}")
    else:
        for raw_name in list(sets.data):
            value = sets.expanded(raw_name, typed=False)
            if value is MISSING:  # an undefined macro, already reported
                unreadable.add(str(raw_name))
            elif value is not None and not isinstance(value, str):
                sets.error(raw_name, f'expected an expression in quotes, got {kind_of(value)} — e.g. {raw_name}: "model-a & model-b"')
                unreadable.add(str(raw_name))
            definitions[str(raw_name)] = value if isinstance(value, str) else ""
        if not definitions:
            matrix.error("sets", f"no sets defined — add at least one, e.g. {SET_EXAMPLE}")
    compiled, problems = compile_sets(definitions, resolve)
    for name, messages in problems.items():
        if name in unreadable:
            continue
        for message in messages:
            sets.error(name, message)
    matrix.warn_unread()
    if len(matrix.log.problems) > problems_before:
        return None
    return MatrixPolicy(compiled, costs)


def _read_vars(table: Section | None, index: ModelIndex) -> dict[str, str]:
    """Short name → model ID (an alias names its model)."""
    if table is None:
        return {}
    variables: dict[str, str] = {}
    for raw_name in list(table.data):
        name = str(raw_name)
        key = table.path(name)
        target = table.text(raw_name)
        if not VAR_NAME.fullmatch(name):
            table.log.error(key, f'"{name}" is not a valid var name — use 1 to 32 letters, digits, "-" or "."')
            continue
        if not target:
            table.log.error(key, f"missing the model it stands for — e.g. {name}: my-model-id")
            continue
        real = index.resolve(target)
        if real is None:
            table.log.error(key, index.unknown(target))
            continue
        shadowed = index.resolve(name)
        if shadowed is not None and shadowed != real:
            named = f"model {name}" if shadowed == name else f"alias {name} of model {shadowed}"
            table.log.warn(
                key,
                f'"{name}" is also {named}, but this var stands for model {real}: in sets and evict_costs '
                f'"{name}" means {real}, not {shadowed} (a var wins over a model ID or alias) — '
                f"rename the var if you meant {shadowed}",
            )
        variables[name] = real
    return variables


def _read_evict_costs(table: Section | None, resolve) -> dict[str, int]:
    """Model ID → the cost of evicting it (default 1), keyed by var or model ID."""
    if table is None:
        return {}
    return table.model_integers(
        resolve, lambda name: f'"{name}" is neither a var nor a model ID — add it under vars or fix the spelling',
        "cost is", default=None, minimum=1, example=lambda name: f"{name}: 10",
    )
