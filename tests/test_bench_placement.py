"""The placement benchmark's hand-written groupings: every partition of the six models, and only those an
operator could write without running out of memory."""

from bench.placement import MODELS, compare, partitions, writable


def test_every_way_to_split_the_six_models_is_tried_once():
    found = [tuple(sorted(tuple(sorted(g)) for g in groups)) for groups in partitions(list(MODELS))]
    assert len(found) == len(set(found)) == 203  # the Bell number of 6
    assert all(sorted(m for g in groups for m in g) == sorted(MODELS) for groups in found)


def test_a_grouping_is_kept_only_when_one_member_of_each_group_fits_at_once():
    assert writable((tuple(MODELS),))  # one model at a time
    assert not writable(tuple((m,) for m in MODELS))  # all 64 GiB at once on 48
    assert writable((("chat-32b", "summarize-24b"), ("coder-14b",), ("vision-11b", "chat-8b"), ("embed",)))
    assert not writable((("chat-32b",), ("summarize-24b",), ("coder-14b", "vision-11b", "chat-8b", "embed")))


def test_the_comparison_is_the_same_each_run():
    assert compare(3, 0.25) == compare(3, 0.25)
