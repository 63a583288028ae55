"""A model's `capabilities:` — what it accepts and produces, told to clients through `/v1/models`.

llamaswap never acts on them: chat UIs read them to decide, say, whether to offer image upload or
tools. An all-empty block means "not configured", as in llama-swap.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import kind_of
from .fields import MISSING, Section

MODALITIES = ("text", "audio", "image")


@dataclass(frozen=True)
class ModelCapabilities:
    inputs: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()
    tools: bool = False
    reranker: bool = False
    context: int = 0

    @property
    def is_empty(self) -> bool:
        return not (self.inputs or self.outputs or self.tools or self.reranker or self.context)


# /v1/models serves `context` as a JSON number: above 2^53 - 1 a JavaScript client reads it wrongly.
MAX_CONTEXT = 2**53 - 1


def read_capabilities(model: Section) -> ModelCapabilities:
    section = model.section("capabilities")
    if section is None:
        return ModelCapabilities()
    capabilities = ModelCapabilities(
        inputs=_modalities(section, "in"),
        outputs=_modalities(section, "out"),
        tools=section.boolean("tools", False),
        reranker=section.boolean("reranker", False),
        context=section.integer("context", 0, minimum=0, maximum=MAX_CONTEXT, example="32768"),
    )
    section.warn_unread()
    return capabilities


def _modalities(section: Section, name: str) -> tuple[str, ...]:
    value = section.expanded(name, typed=False)
    if value is MISSING or value is None:
        return ()
    if not isinstance(value, list):
        section.error(name, f"expected a list of modalities, got {kind_of(value)} — e.g. {name}: [text, image]")
        return ()
    seen: list[str] = []
    for index, item in enumerate(value):
        key = f"{section.path(name)}[{index}]"
        if item not in MODALITIES:
            section.log.error(key, f"{item!r} is not a modality — use {', '.join(MODALITIES)}")
        elif item in seen:
            section.log.error(key, f"{item} is listed twice — remove one")
        else:
            seen.append(item)
    return tuple(seen)
