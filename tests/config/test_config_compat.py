"""llama-swap's own example configs load, and what llamaswap ignores is named.

The corpus lives in `shared/compat/`, a sibling of the repository folder.
"""

from pathlib import Path

import pytest
import yaml

from proxy.config import ConfigError, load_config, parse_config

COMPAT = Path(__file__).resolve().parents[2].parent / "shared" / "compat"
EXAMPLE = COMPAT / "llama-swap.config.example.yaml"
DOCKER_EXAMPLE = COMPAT / "llama-swap.docker.config.example.yaml"

pytestmark = pytest.mark.skipif(
    not EXAMPLE.is_file() or not DOCKER_EXAMPLE.is_file(),
    reason=f"llama-swap compat corpus not found at {COMPAT} (expected shared/ next to the repository)",
)

# Models the example's groups, fifo priorities and preload mention without defining them.
ILLUSTRATIVE_REFERENCES = {
    "routing.router.settings.groups.group1.members[0]",
    "routing.router.settings.groups.group1.members[1]",
    "routing.router.settings.groups.group2.members[1]",
    "routing.router.settings.groups.group2.members[2]",
    "routing.router.settings.groups.forever.members[0]",
    "routing.router.settings.groups.forever.members[1]",
    "routing.router.settings.groups.forever.members[2]",
    "routing.scheduler.settings.fifo.priority.A",
    "routing.scheduler.settings.fifo.priority.B",
    "routing.scheduler.settings.fifo.priority.C",
    "routing.scheduler.settings.fifo.priority.D",
    "hooks.on_startup.preload[0]",
    "selectors.coding-model.targets[1]",
    "selectors.llama.targets[1]",
    "selectors.llama.targets[2]",
    "profiles.coding.pins.llm-plan",
}


@pytest.fixture(autouse=True)
def example_environment(monkeypatch):
    """The example reads ${env.HOME}, ${env.API_KEY_1/2} and ${env.OPENROUTER_API_KEY}."""
    monkeypatch.setenv("HOME", "/home/tester")
    monkeypatch.setenv("API_KEY_1", "sk-from-env-1")
    monkeypatch.setenv("API_KEY_2", "sk-from-env-2")
    monkeypatch.setenv("OPENROUTER_API_KEY", "sk-or-test")


def trimmed_example() -> dict:
    """The example without references to models it does not define."""
    data = yaml.safe_load(EXAMPLE.read_text())
    del data["routing"]["router"]["settings"]["groups"]
    del data["routing"]["scheduler"]["settings"]["fifo"]["priority"]
    del data["hooks"]
    data["selectors"]["coding-model"]["targets"].remove("qwen-unlisted")
    data["selectors"]["llama"]["targets"] = ["docker-llama"]
    del data["profiles"]["coding"]["pins"]["llm-plan"]
    return data


def load_data(data: dict):
    return parse_config(yaml.safe_dump(data, sort_keys=False), "example.yaml")


def test_full_example_fails_only_on_references_to_models_it_does_not_define():
    with pytest.raises(ConfigError) as info:
        load_config(EXAMPLE)
    keys = {problem.key for problem in info.value.problems}
    # unlisted-model has neither proxy nor ${PORT} in cmd: llama-swap rejects it too.
    assert keys == ILLUSTRATIVE_REFERENCES | {"models.unlisted-model.proxy"}


def test_each_example_model_loads_on_its_own():
    data = trimmed_example()
    data["models"]["unlisted-model"]["proxy"] = "http://127.0.0.1:8090"
    for model_id, entry in data["models"].items():
        # Selectors and profiles name the other models: they are left out here.
        config = load_data({**data, "models": {model_id: entry}, "selectors": {}, "profiles": {}})
        assert list(config.models) == [model_id]


def test_example_models_are_understood():
    data = trimmed_example()
    data["models"]["unlisted-model"]["proxy"] = "http://127.0.0.1:8090"
    config = load_data(data)

    gpt = config.models["gpt-oss-120b"]
    assert gpt.cmd == (
        "/path/to/llama-server/llama-server-ec9e0301", "--port", "10002",
        "--model", "path/to/gpt-oss-120B.gguf", "--ctx-size", "16384", "--temperature", "0.7",
    )
    assert gpt.proxy == "http://127.0.0.1:8999"
    assert gpt.check_endpoint == "/custom-endpoint"
    assert (gpt.ttl, gpt.unload_timeout, gpt.concurrency_limit) == (60, 10, 10)
    assert gpt.aliases == ("gpt-4o-mini", "gpt-oss-120b:high", "gpt-oss-120b:low")  # setParamsByID keys too
    assert gpt.env == (("CUDA_VISIBLE_DEVICES", "0,1,2"),)
    assert gpt.use_model_name == "openai/gpt-oss-120B"
    assert gpt.filters.strip_params == ("temperature", "top_p", "top_k")
    assert gpt.filters.set_params == {"temperature": 0.7, "top_p": 0.9}
    assert gpt.metadata["port"] == 10002
    assert gpt.metadata["temperature"] == 0.7
    assert gpt.metadata["note"] == "The gpt-oss-120b is running on port 10002 temp=0.7, context=16384"
    assert gpt.metadata["an_obj"]["c"] == (0.7, False, "model: gpt-oss-120b")

    docker = config.models["docker-llama"]
    assert docker.port == 10001  # sorted before gpt-oss-120b
    assert docker.cmd[:4] == ("docker", "run", "--name", "docker-llama")
    assert docker.cmd_stop == ("docker", "stop", "docker-llama")
    assert docker.proxy == "http://127.0.0.1:10001"

    assert config.models["unlisted-model"].unlisted is True
    assert config.health_check_timeout == 500
    assert config.api_keys[2:] == ("sk-from-env-1", "sk-from-env-2")
    assert config.scheduler.use == "fifo"


def test_example_loads_with_no_key_unsupported_and_names_the_ones_done_another_way():
    data = trimmed_example()
    data["models"]["unlisted-model"]["proxy"] = "http://127.0.0.1:8090"
    warnings = load_data(data).warnings
    assert not [warning for warning in warnings if "not supported" in warning or "unknown key" in warning]
    warned = {warning.split(": ")[1] for warning in warnings}
    assert warned == {
        "metricsMaxInMemory", "ui",
        "routing.router.settings.matrix",
    }


def test_docker_example_fails_only_on_the_model_without_a_reachable_port():
    with pytest.raises(ConfigError) as info:
        load_config(DOCKER_EXAMPLE)
    assert [problem.key for problem in info.value.problems] == ["models.z-image.proxy"]


def test_docker_example_loads_once_that_model_names_its_proxy():
    data = yaml.safe_load(DOCKER_EXAMPLE.read_text())
    data["models"]["z-image"]["proxy"] = "http://127.0.0.1:9999"
    config = load_data(data)
    assert set(config.models) == {"qwen2.5", "smollm2", "z-image"}
    assert config.health_check_timeout == 300
    assert config.models["qwen2.5"].cmd == (
        "/app/llama-server", "-hf", "bartowski/Qwen2.5-0.5B-Instruct-GGUF:Q4_K_M", "--port", "9999",
    )
    assert config.models["z-image"].check_endpoint == "/"
    assert config.resolve("dall-e-3").id == "z-image"
    assert {warning.split(": ")[1] for warning in config.warnings} == {"logRequests", "metricsMaxInMemory"}
