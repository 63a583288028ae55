"""llama-swap's matrix router: the set expressions and the solver, checked against a brute force."""

import itertools

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from scheduling.core import MatrixPolicy, MatrixSyntaxError, compile_sets, parse_expression

from .search_effort import property_settings


def policy_of(definitions: dict[str, str], costs: dict[str, int] | None = None) -> MatrixPolicy:
    sets, problems = compile_sets(definitions, lambda name: name)
    assert problems == {}
    return MatrixPolicy(sets, costs)


def expanded(text: str, **others: str) -> list[set[str]]:
    sets, problems = compile_sets({"s": text, **others}, lambda name: name)
    assert problems == {}
    return [set(combination) for combination in sets[0].combinations]


# The expansion table of llama-swap's example config (its comments), in order.
@pytest.mark.parametrize(
    "text, combinations",
    [
        ("model-a", [{"model-a"}]),
        ("a & b", [{"a", "b"}]),
        ("a | b", [{"a"}, {"b"}]),
        ("(a | b) & c", [{"a", "c"}, {"b", "c"}]),
        ("(a | b) & (c | d)", [{"a", "c"}, {"a", "d"}, {"b", "c"}, {"b", "d"}]),
        ("a | b & c", [{"a"}, {"b", "c"}]),  # & binds tighter than |
        ("a & a | a", [{"a"}]),  # repeats collapse
        ("  qwen3.5-4b&x_y  ", [{"qwen3.5-4b", "x_y"}]),
    ],
)
def test_expressions_expand_like_llama_swap(text, combinations):
    assert expanded(text) == combinations


def test_a_reference_inlines_the_other_set_whatever_order_they_are_defined_in():
    assert expanded("+llms & v", llms="g | q") == [{"g", "v"}, {"q", "v"}]


@pytest.mark.parametrize(
    "text, message, position",
    [
        ("", "empty expression", 1),
        ("a &", "found the end of the expression", 4),
        ("(a | b", "missing ')' for the '(' at character 1", 7),
        ("a b", "unexpected 'b'", 3),
        ("a & qwen/7b", "unexpected character '/'", 9),
        ("+ a", "expected a set name after '+'", 1),
        ("a | )", "found ')'", 5),
    ],
)
def test_syntax_errors_name_the_character(text, message, position):
    with pytest.raises(MatrixSyntaxError) as info:
        parse_expression(text)
    assert message in str(info.value)
    assert info.value.position == position
    assert str(info.value).endswith(f"at character {position}")


def test_compile_reports_every_set_and_keeps_the_good_ones():
    sets, problems = compile_sets(
        {"ok": "a & b", "bad": "a & (", "unknown": "a & zz", "dangling": "+nowhere", "self": "+self | a", "user": "+self & a"},
        lambda name: None if name == "zz" else name,
    )
    assert [s.name for s in sets] == ["ok"]
    assert set(problems) == {"bad", "unknown", "dangling", "self"}  # "user" only fails through "self"
    assert "circle (+self → +self)" in problems["self"][0]


# -- the solver ---------------------------------------------------------------------------------


def test_target_already_running_evicts_nothing():
    assert policy_of({"s": "a"}).evictions("a", ["a", "b"]) == frozenset()


def test_a_model_in_no_set_runs_alone():
    policy = policy_of({"s": "a & b"})
    assert policy.evictions("c", ["a", "b"]) == {"a", "b"}
    assert policy.evictions("a", ["c"]) == {"c"}


def test_swap_evicts_conflicting_and_keeps_set_mates():
    policy = policy_of({"s": "(g | q) & v"})
    assert policy.evictions("q", ["g", "v"]) == {"g"}
    assert policy.evictions("v", ["g"]) == frozenset()


def test_evict_costs_steer_the_choice():
    definitions = {"with_a": "t & a", "with_b": "t & b"}
    assert policy_of(definitions).evictions("t", ["a", "b"]) == {"b"}  # tie: first defined set
    assert policy_of(definitions, {"a": 3}).evictions("t", ["a", "b"]) == {"b"}
    assert policy_of(definitions, {"b": 3}).evictions("t", ["a", "b"]) == {"a"}


def test_ties_go_to_the_set_defined_first():
    policy = policy_of({"second": "t & b", "first": "t & a"})
    choice = policy.choose("t", ["a", "b"])
    assert (choice.set_name, choice.evict, choice.cost) == ("second", {"a"}, 1)


def test_costs_are_summed_over_the_evicted_models():
    definitions = {"keep_big": "t & big", "keep_pair": "t & x & y"}
    assert policy_of(definitions, {"big": 3}).evictions("t", ["big", "x", "y"]) == {"x", "y"}  # 2 < 3
    assert policy_of(definitions).evictions("t", ["big", "x", "y"]) == {"big"}  # 1 < 2
    assert policy_of(definitions, {"big": 2}).evictions("t", ["big", "x", "y"]) == {"x", "y"}  # 2 == 2: first set


def test_costs_must_be_whole_numbers_of_at_least_one():
    with pytest.raises(ValueError):
        MatrixPolicy([], {"a": 0})


# -- brute force ---------------------------------------------------------------------------------

MODELS = ("a", "b", "c", "d", "e")


def expressions(set_names: list[str]):
    """(text, tree) pairs; trees are ("name", x), ("ref", set), ("and"|"or", [children])."""
    leaves = st.sampled_from(MODELS).map(lambda m: (m, ("name", m)))
    if set_names:
        leaves = leaves | st.sampled_from(set_names).map(lambda s: (f"+{s}", ("ref", s)))

    def combine(children):
        return st.tuples(st.sampled_from(["&", "|"]), st.lists(children, min_size=2, max_size=3), st.sampled_from(["", " "])).map(
            lambda t: (
                f"{t[2]}{t[0]}{t[2]}".join(f"({text})" for text, _ in t[1]),
                ("and" if t[0] == "&" else "or", [tree for _, tree in t[1]]),
            )
        )

    return st.recursive(leaves, combine, max_leaves=5)


@st.composite
def matrices(draw):
    """Definitions in order (a set may reference earlier ones), their trees and costs."""
    count = draw(st.integers(1, 4))
    texts, trees = {}, {}
    for index in range(count):
        text, tree = draw(expressions(list(texts)))
        texts[f"s{index}"], trees[f"s{index}"] = text, tree
    costs = draw(st.dictionaries(st.sampled_from(MODELS), st.integers(1, 5), max_size=5))
    return texts, trees, costs


def fits(tree, models: frozenset, trees) -> bool:
    """May `models` run together under `tree`? Decided without expanding it: an AND holds when
    every model can be handed to some part so that each part's share fits that part."""
    kind, value = tree
    if kind == "name":
        return models <= {value}
    if kind == "ref":
        return fits(trees[value], models, trees)
    if kind == "or":
        return any(fits(child, models, trees) for child in value)
    ordered = sorted(models)
    for owners in itertools.product(range(len(value)), repeat=len(ordered)):
        shares = [frozenset(m for m, owner in zip(ordered, owners) if owner == i) for i in range(len(value))]
        if all(fits(child, share, trees) for child, share in zip(value, shares)):
            return True
    return False


def brute_force(target, running, trees, costs):
    """(least cost, names of the sets reaching it in definition order); ([], cost of all) when no set holds target."""
    running = frozenset(running)
    cost = lambda models: sum(costs.get(m, 1) for m in models)
    best, winners = None, []
    for name, tree in trees.items():
        for size in range(len(running) + 1):
            for kept in itertools.combinations(sorted(running), size):
                if fits(tree, frozenset(kept) | {target}, trees):
                    price = cost(running - set(kept))
                    if best is None or price < best:
                        best, winners = price, [name]
                    elif price == best and name not in winners:
                        winners.append(name)
    return (cost(running), []) if best is None else (best, winners)


@property_settings(200)
@given(matrices(), st.sampled_from(MODELS + ("lonely",)), st.sets(st.sampled_from(MODELS + ("lonely",)), max_size=5))
def test_solver_matches_brute_force(matrix, target, running):
    texts, trees, costs = matrix
    running -= {target}
    policy = policy_of(texts, costs)
    choice = policy.choose(target, running)
    best, winners = brute_force(target, running, trees, costs)

    assert choice.evict <= running and target not in choice.evict
    assert choice.cost == best == sum(costs.get(m, 1) for m in choice.evict)
    if winners:
        assert choice.set_name == winners[0]  # ties go to the set defined first
        assert fits(trees[choice.set_name], (running - choice.evict) | {target}, trees)
    else:
        assert choice.set_name is None and choice.evict == running
    assert policy.evictions(target, running | {target}) == frozenset()


@property_settings(200)
@given(matrices(), st.sampled_from(MODELS), st.sampled_from(MODELS))
def test_coexistence_is_symmetric_and_means_a_set_holds_both(matrix, one, other):
    assume(one != other)
    texts, trees, costs = matrix
    policy = policy_of(texts, costs)
    together = any(fits(tree, frozenset({one, other}), trees) for tree in trees.values())
    assert (not policy.evictions(one, [other])) == together == (not policy.evictions(other, [one]))
