"""What `/v1/models` says about a configured model beyond its ID: the capabilities it declares, and
an entry per alias when `includeAliasesInList` is on — in llama-swap's field names and shapes, which
chat UIs already read (OpenRouter's: `architecture`, `supported_parameters`, `context_length`)."""

from __future__ import annotations

import copy
from typing import Any

from proxy.config.capabilities import ModelCapabilities

# Fields the capabilities render; a model's metadata keys of the same names are dropped from
# meta.llamaswap so a client never finds two answers to one question.
CAPABILITY_FIELDS = ("architecture", "capabilities", "supported_parameters", "context_length")


def capability_fields(caps: ModelCapabilities) -> dict[str, Any]:
    """The fields `caps` adds to a model's entry; none for a model without capabilities."""
    fields: dict[str, Any] = {}
    inputs, outputs = set(caps.inputs), set(caps.outputs)
    architecture: dict[str, Any] = {}
    if caps.inputs:
        architecture["input_modalities"] = list(caps.inputs)
    if caps.outputs:
        architecture["output_modalities"] = list(caps.outputs)
    if caps.inputs and caps.outputs:
        architecture["modality"] = "+".join(caps.inputs) + "->" + "+".join(caps.outputs)
    if architecture:
        fields["architecture"] = architecture
    flags = {
        "vision": "image" in inputs,
        "audio_transcriptions": "audio" in inputs and "text" in outputs,
        "audio_speech": "text" in inputs and "audio" in outputs,
        "image_generation": "text" in inputs and "image" in outputs,
        "image_to_image": "image" in inputs and "image" in outputs,
        "function_calling": caps.tools,
        "reranker": caps.reranker,
    }
    if any(flags.values()):
        fields["capabilities"] = {name: True for name, on in flags.items() if on}
    if caps.tools:
        fields["supported_parameters"] = ["tools", "tool_choice"]
    if caps.context:
        fields["context_length"] = caps.context
    return fields


def add_capabilities(entry: dict[str, Any], caps: ModelCapabilities) -> None:
    """Write `caps` into a model's entry: the rendered fields, and `meta.n_ctx` for the context."""
    if caps.is_empty:
        return
    entry.update(capability_fields(caps))
    for name in CAPABILITY_FIELDS:
        entry["meta"]["llamaswap"].pop(name, None)
    if caps.context:
        entry["meta"]["n_ctx"] = caps.context


def alias_entries(entry: dict[str, Any], model) -> list[dict[str, Any]]:
    """One copy of the model's entry per alias, under the alias's ID, saying which model it names."""
    entries = []
    for alias in model.aliases:
        copied = copy.deepcopy(entry)
        copied["id"] = alias
        meta = copied["meta"]["llamaswap"]
        meta.pop("aliases", None)
        meta.update(type="alias", modelID=model.id)
        entries.append(copied)
    return entries
