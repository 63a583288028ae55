"""The matrix router in config.yaml: llama-swap's example block, both spellings, and every mistake
reported with its key path and fix, all at once."""

from pathlib import Path

import pytest
import yaml

from scheduling.operating.config_inputs import swap_policy
from scheduling.core import MatrixPolicy, SwapPolicy

COMPAT_EXAMPLE = Path(__file__).resolve().parents[2].parent / "shared" / "compat" / "llama-swap.config.example.yaml"

MODELS = """
models:
  llama: {cmd: a, proxy: "http://h:1", aliases: [gpt-4o]}
  qwen: {cmd: b, proxy: "http://h:2"}
  embed: {cmd: c, proxy: "http://h:3"}
  tts: {cmd: d, proxy: "http://h:4"}
"""

MATRIX = """
routing:
  router:
    use: matrix
    settings:
      matrix:
        vars: {l: llama, q: qwen}
        evict_costs: {l: 5}
        sets:
          chat: "(l | q) & embed"
          speech: "+chat & tts"
"""


def combinations(policy: MatrixPolicy) -> dict[str, set[frozenset[str]]]:
    return {matrix_set.name: set(matrix_set.combinations) for matrix_set in policy.sets}


def test_routing_router_use_matrix_is_loaded_and_chosen_by_the_service(load):
    config = load(MODELS + MATRIX)
    assert config.warnings == ()
    assert config.groups == ()
    assert combinations(config.matrix) == {
        "chat": {frozenset({"llama", "embed"}), frozenset({"qwen", "embed"})},
        "speech": {frozenset({"llama", "embed", "tts"}), frozenset({"qwen", "embed", "tts"})},
    }
    assert config.matrix.evict_cost("llama") == 5 and config.matrix.evict_cost("qwen") == 1
    assert swap_policy(config) is config.matrix
    assert "router: matrix" in config.describe()


def test_group_router_stays_the_default(load):
    config = load(MODELS)
    assert config.matrix is None
    assert isinstance(swap_policy(config), SwapPolicy)


def test_legacy_top_level_matrix(load):
    config = load(MODELS + 'matrix: {sets: {pair: "llama & qwen"}}\n')
    assert combinations(config.matrix) == {"pair": {frozenset({"llama", "qwen"})}}


def test_aliases_and_vars_name_models_and_a_var_wins_over_a_model_id(load):
    config = load(MODELS + 'matrix: {vars: {qwen: llama}, sets: {s: "gpt-4o & qwen", t: "embed"}}\n')
    assert combinations(config.matrix) == {"s": {frozenset({"llama"})}, "t": {frozenset({"embed"})}}


def test_the_block_of_the_other_router_is_ignored_with_a_warning(load):
    config = load(MODELS + MATRIX + "      groups: {g: {members: [llama]}}\n")
    assert config.groups == ()
    assert config.warnings == ("config.yaml: routing.router.settings.groups: ignored because routing.router.use is matrix",)


def test_every_matrix_problem_is_reported_at_once_with_its_key_path(config_error, problem):
    error = config_error(
        MODELS
        + """
routing:
  router:
    use: matrix
    settings:
      matrix:
        vars: {l: llama, "bad_name": qwen, g: ghost}
        evict_costs: {l: 0, q: 3, embed: 2.5, llama: 4}
        sets:
          broken: "(l | embed"
          stray: "l & & embed"
          symbol: "l & qwen:7b"
          unknown: "l & nobody"
          dangling: "+missing & l"
          loop1: "+loop2 & l"
          loop2: "+loop1"
          number: 7
          macro: "l & ${nothing}"
"""
    )
    base = "routing.router.settings.matrix"
    assert 'not a valid var name' in problem(error, f"{base}.vars.bad_name")
    assert 'no model or alias is called "ghost"' in problem(error, f"{base}.vars.g")
    assert "0 is below the minimum of 1" in problem(error, f"{base}.evict_costs.l")
    assert '"q" is neither a var nor a model ID' in problem(error, f"{base}.evict_costs.q")
    assert "expected a whole number, got the number 2.5" in problem(error, f"{base}.evict_costs.embed")
    assert 'already set by "l"' in problem(error, f"{base}.evict_costs.llama")
    assert "missing ')' for the '(' at character 1" in problem(error, f"{base}.sets.broken")
    assert "found '&' at character 5" in problem(error, f"{base}.sets.stray")
    symbol = problem(error, f"{base}.sets.symbol")
    assert "unexpected character ':' (names in a set use letters, digits, '_', '-' and '.'" in symbol
    assert "a short name under vars, which uses only letters, digits, '-' and '.'" in symbol  # no '_' in var names
    assert "at character 9" in problem(error, f"{base}.sets.symbol")
    assert '"nobody" is neither a var nor a model ID' in problem(error, f"{base}.sets.unknown")
    assert '"+missing" names no set' in problem(error, f"{base}.sets.dangling")
    assert "circle (+loop1 → +loop2 → +loop1)" in problem(error, f"{base}.sets.loop1")
    assert "expected an expression in quotes, got the number 7" in problem(error, f"{base}.sets.number")
    assert "${nothing} is not a defined macro" in problem(error, f"{base}.sets.macro")
    assert len(error.problems) == 14, str(error)
    assert all(line.startswith("config.yaml: ") for line in str(error).splitlines())


@pytest.mark.parametrize(
    "block, key, fragment",
    [
        ("routing: {router: {use: matrix}}", "routing.router.settings.matrix", "add settings.matrix"),
        ("routing: {router: {use: matrix, settings: {matrix: null}}}", "routing.router.settings.matrix", "add settings.matrix"),
        ("matrix: {vars: {l: llama}}", "matrix.sets", "missing — name the model combinations"),
        ("matrix: {sets: {}}", "matrix.sets", "no sets defined"),
        ("matrix: {sets: null}", "matrix.sets", "missing — name the model combinations"),
        ('matrix: {sets: {empty: "  "}}', "matrix.sets.empty", "empty expression"),
        ('matrix: {sets: {s: "llama +"}}', "matrix.sets.s", "expected a set name after '+' at character 7"),
        ('matrix: {sets: {s: "llama qwen"}}', "matrix.sets.s", "unexpected 'qwen' (missing & or | before it?) at character 7"),
        ("matrix: {sets: {a: llama}}\ngroups: {g: {members: [qwen]}}", "matrix", "delete one"),
        ("matrix: {sets: {a: llama}}\nrouting: {router: {use: matrix}}", "matrix", "move the matrix to routing.router.settings.matrix"),
    ],
)
def test_matrix_config_errors(config_error, problem, block, key, fragment):
    assert fragment in problem(config_error(MODELS + block + "\n"), key)


def test_a_set_past_the_combination_limit_is_an_error(config_error, problem):
    names = "\n".join(f"  m{i}: {{cmd: x, proxy: 'http://h:{i + 1}'}}" for i in range(26))
    product = " & ".join(f"(m{2 * i} | m{2 * i + 1})" for i in range(13))
    error = config_error(f"models:\n{names}\nmatrix: {{sets: {{huge: '{product}'}}}}\n")
    assert "expands to more than 4096 combinations" in problem(error, "matrix.sets.huge")


@pytest.mark.skipif(not COMPAT_EXAMPLE.is_file(), reason="llama-swap compat corpus not found next to the repository")
def test_llama_swap_example_matrix_expands_as_its_comments_say(load):
    """The example's matrix names illustrative models; define them and switch the router to it."""
    example = yaml.safe_load(COMPAT_EXAMPLE.read_text())
    matrix = example["routing"]["router"]["settings"]["matrix"]
    models = ["gemma-model", "qwen-model", "mistral-model", "voxtral-model", "reranker-model", "llama-70B", "stable-diffusion"]
    data = {
        "models": {model: {"cmd": "run", "proxy": f"http://h:{port}"} for port, model in enumerate(models, 1)},
        "routing": {"router": {"use": "matrix", "settings": {"matrix": matrix}}},
    }
    config = load(yaml.safe_dump(data, sort_keys=False))
    g, q, m, v, e = "gemma-model", "qwen-model", "mistral-model", "voxtral-model", "reranker-model"
    assert [matrix_set.name for matrix_set in config.matrix.sets] == ["standard", "with_rerank", "creative", "full"]
    assert combinations(config.matrix) == {
        "standard": {frozenset({g, v}), frozenset({q, v}), frozenset({m, v})},
        "with_rerank": {frozenset({g, v, e}), frozenset({q, v, e})},
        "creative": {frozenset({g, "stable-diffusion"}), frozenset({q, "stable-diffusion"})},
        "full": {frozenset({"llama-70B"})},
    }
    policy = config.matrix
    assert (policy.evict_cost(v), policy.evict_cost("llama-70B"), policy.evict_cost(g)) == (50, 30, 1)
    # The TTS (cost 50) stays: switching the LLM keeps the voice model and drops only the other LLM.
    assert policy.evictions(m, [g, v]) == {g}
    # The reranker needs a set with it: with_rerank keeps gemma and voxtral.
    assert policy.evictions(e, [g, v]) == frozenset()
    # Image generation is not in a set with voxtral: it must go, whatever it costs.
    assert policy.evictions("stable-diffusion", [q, v]) == {v}
    # The 70B model runs alone.
    assert policy.evictions("llama-70B", [q, v, e]) == {q, v, e}
