"""llama-swap's group router: which running models a start evicts."""

import pytest

from scheduling.core import DEFAULT_GROUP, SwapGroup, SwapPolicy


def test_with_no_groups_only_one_model_runs_at_a_time():
    policy = SwapPolicy([], ["a", "b", "c"])
    assert policy.group_of("a") == DEFAULT_GROUP
    assert policy.evictions("b", ["a", "c"]) == {"a", "c"}


def test_swap_group_stops_its_previous_member():
    policy = SwapPolicy([SwapGroup("g", ("a", "b"))], ["a", "b"])
    assert policy.evictions("b", ["a"]) == {"a"}


def test_non_swap_group_members_run_together():
    policy = SwapPolicy([SwapGroup("g", ("a", "b"), swap=False)], ["a", "b"])
    assert policy.evictions("b", ["a"]) == frozenset()


def test_exclusive_group_evicts_other_groups():
    policy = SwapPolicy([SwapGroup("g1", ("a",)), SwapGroup("g2", ("b", "c"), swap=False)], ["a", "b", "c"])
    assert policy.evictions("a", ["b", "c"]) == {"b", "c"}


def test_non_exclusive_groups_run_in_parallel():
    policy = SwapPolicy(
        [SwapGroup("g1", ("a",), exclusive=False), SwapGroup("g2", ("b",), exclusive=False)], ["a", "b"]
    )
    assert policy.evictions("a", ["b"]) == frozenset()
    assert policy.evictions("b", ["a"]) == frozenset()


def test_non_exclusive_member_does_not_unload_running_exclusive_groups():
    # llama-swap's gotcha, kept for compatibility.
    policy = SwapPolicy([SwapGroup("ex", ("a",)), SwapGroup("side", ("b",), exclusive=False)], ["a", "b"])
    assert policy.evictions("b", ["a"]) == frozenset()
    # ...while starting the exclusive one does evict the non-exclusive one.
    assert policy.evictions("a", ["b"]) == {"b"}


def test_persistent_group_is_never_evicted_by_other_groups():
    policy = SwapPolicy(
        [SwapGroup("embed", ("e",), persistent=True), SwapGroup("chat", ("a", "b"))], ["e", "a", "b"]
    )
    assert policy.evictions("a", ["e", "b"]) == {"b"}


def test_persistent_group_still_swaps_its_own_members():
    policy = SwapPolicy([SwapGroup("p", ("x", "y"), persistent=True)], ["x", "y", "z"])
    assert policy.evictions("y", ["x"]) == {"x"}
    # A persistent exclusive group still evicts other, non-persistent groups.
    assert policy.evictions("y", ["z"]) == {"z"}


def test_ungrouped_models_share_the_exclusive_default_group():
    policy = SwapPolicy([SwapGroup("g", ("a", "b"), swap=False, exclusive=False)], ["a", "b", "c", "d"])
    assert policy.group_of("c") == policy.group_of("d") == DEFAULT_GROUP
    assert policy.evictions("c", ["a", "b", "d"]) == {"a", "b", "d"}
    assert policy.evictions("a", ["c"]) == frozenset()


def test_never_evicts_the_target_itself():
    policy = SwapPolicy([], ["a", "b"])
    assert policy.evictions("a", ["a", "b"]) == {"b"}
    assert policy.evictions("a", ["a"]) == frozenset()


def test_model_in_two_groups_is_refused():
    with pytest.raises(ValueError, match="'a' is in swap groups 'g1' and 'g2'"):
        SwapPolicy([SwapGroup("g1", ("a",)), SwapGroup("g2", ("a", "b"))], ["a", "b"])


def test_unknown_member_is_refused():
    with pytest.raises(ValueError, match="unknown model 'nope'"):
        SwapPolicy([SwapGroup("g", ("nope",))], ["a"])


def test_duplicate_and_reserved_group_names_are_refused():
    with pytest.raises(ValueError, match="defined twice"):
        SwapPolicy([SwapGroup("g", ("a",)), SwapGroup("g", ("b",))], ["a", "b"])
    with pytest.raises(ValueError, match="reserved"):
        SwapPolicy([SwapGroup(DEFAULT_GROUP, ("a",))], ["a"])


def test_unknown_model_has_no_group():
    with pytest.raises(KeyError, match="'zz' is not configured"):
        SwapPolicy([], ["a"]).group_of("zz")
