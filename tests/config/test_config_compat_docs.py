"""llama-swap's documentation examples for peers, selectors and profiles load as llama-swap reads them.

Each file in `llama_swap_docs/` is one documentation page's snippets joined, with the local models
they name added; none may draw a warning, since every key in them is one llamaswap acts on.
"""

from pathlib import Path

import pytest

from proxy.config import load_config

DOCS = Path(__file__).resolve().parent / "llama_swap_docs"


@pytest.fixture(autouse=True)
def provider_key(monkeypatch):
    monkeypatch.setenv("OPENROUTER_API_KEY", "sk-or-docs")


@pytest.mark.parametrize("name", sorted(path.name for path in DOCS.glob("*.yaml")))
def test_documentation_example_loads_without_a_warning(name):
    assert load_config(DOCS / name).warnings == ()


def test_peers_example_names_each_peer_model_and_injects_the_provider_key():
    config = load_config(DOCS / "peers-and-multi-host.yaml")
    peer, model = config.peer_model("openrouter/z-ai/glm-4.7")
    assert (peer.id, model, peer.api_key) == ("openrouter", "z-ai/glm-4.7", "sk-or-docs")
    assert config.peer_model("gemma-3-27b")[0].id == "workstation"  # one peer offers it: the bare name works
    assert config.peer_model("local-llama") is None  # a local model is never a peer's
    workstation = config.peers["workstation"]
    assert workstation.timeouts.response_header == 120
    assert workstation.api_key == ""
    assert config.peers["openrouter"].timeouts.response_header == 60  # a peer's default
    assert config.peers["openrouter"].filters.strip_params == ("top_k",)
    assert config.peers["openrouter"].filters.set_params == {"provider": {"data_collection": "deny", "zdr": True}}
    spill = config.selectors["llama"]
    assert (spill.strategy, spill.spillover) == ("spillover", 4)
    assert spill.targets == ("local-llama", "workstation/qwen3-coder-30b", "openrouter/z-ai/glm-4.7")


def test_profiles_example_pins_and_disables_and_its_selectors_keep_their_order():
    config = load_config(DOCS / "profiles-and-selectors.yaml")
    coding = config.profiles["coding"]
    assert coding.description == "Coding-focused model routing"
    assert coding.pins["llm-code"] == "qwen3-coder-30b"
    assert coding.pins["llm-plan"] == "gpt-oss-120b"
    assert not coding.pins["image-gen"]  # `~` disables the ID while the profile is active
    assert config.profiles["writing"].pins == {"llm-code": "gemma-3-27b", "llm-plan": "gemma-3-27b"}
    assert (config.startup_profile, config.remember_profile) == ("coding", True)
    warm = config.selectors["coding-model"]
    assert (warm.strategy, warm.targets, warm.name) == ("warm", ("gpt-oss-120b", "qwen3-coder-30b"), "Coding Model")
    # two peers offer `llama`: only the qualified names reach it, and the selector uses those
    assert config.peers_offering("llama") == ("peer-a/llama", "peer-b/llama")
    assert config.peer_model("llama") is None
