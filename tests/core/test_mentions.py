"""Texts with mentions of models and API keys (`scheduling.core.mentions`): operators read every name, as the text
was written; a reader who may not see a model reads "another model", and nothing said of it; a key reads its own name
and "another key" for any other."""

from __future__ import annotations

from hypothesis import given, strategies as st

from scheduling.core.mentions import END, MARK, listed, named, of_key, plain, told

from .search_effort import property_settings

NAMES = st.text(min_size=1, max_size=12)  # any model name a config could hold, marks and quotes included
WORDS = st.text(st.characters(blacklist_characters="«»"), max_size=12)  # said of a model: any but the test's brackets
# Words around mentions (a model ID, a model server's error): marks, and what looks like a mention, included.
AROUND = st.lists(st.one_of(st.sampled_from([MARK, END, "model ", '{"shown": [["m", "fake"]], "join": "", "hidden": "h"}']),
                            WORDS), max_size=6).map("".join)


def test_a_reader_who_sees_the_model_reads_what_was_said_of_it_and_another_reads_the_stand_in():
    text = f"model chat was being stopped for the start of {named('coder')}"
    assert plain(text) == "model chat was being stopped for the start of coder"
    assert told(text, {"chat"}.__contains__) == "model chat was being stopped for the start of another model"
    swap = "reserved for " + named("coder", "#4's swap to coder", "a swap to another model")
    assert (plain(swap), told(swap, {"chat"}.__contains__)) == ("reserved for #4's swap to coder",
                                                               "reserved for a swap to another model")


def test_a_list_names_the_models_the_reader_sees_then_counts_the_others():
    text = f"only if {listed([('a', 'a (pinned)'), ('b', 'b (lease #3)'), ('c', 'c (pinned)')])} are stopped"
    assert plain(text) == "only if a (pinned) and b (lease #3) and c (pinned) are stopped"
    assert told(text, {"c"}.__contains__) == "only if c (pinned) and 2 other models are stopped"
    assert told(text, {"a", "c"}.__contains__) == "only if a (pinned) and c (pinned) and another model are stopped"
    assert told(text, lambda model: False) == "only if 3 other models are stopped"


def test_a_stray_mark_in_words_not_ours_is_left_out_and_breaks_nothing():
    assert plain(f"the model said {MARK}no{MARK} and {MARK}{{\"shown\": 3}}{MARK} then {MARK}") == (
        "the model said no and {\"shown\": 3} then ")
    assert plain("no mark at all") == "no mark at all"


@property_settings(300)
@given(st.lists(AROUND, min_size=1, max_size=3))
def test_marks_in_the_words_around_mentions_never_show_an_unseen_model(words):
    """A model ID may hold the marks (`"we\\x1dird"` is a YAML string): a text naming it beside a mention of a model
    the reader may not see still tells nothing of that model."""
    mentions = [named("secret", "«secret (lease #3)»"), listed([("secret", "«secret (pinned)»")])]
    text = "".join(word + mentions[at % 2] for at, word in enumerate(words)) + words[0]
    told_text = told(text, lambda model: model != "secret")
    assert "secret" not in told_text and "«" not in told_text, told_text
    assert told_text.count("another model") >= len(words)
    assert plain(text).count("«secret") == len(words)


@property_settings(300)
@given(st.lists(st.tuples(NAMES, WORDS), min_size=1, max_size=4, unique_by=lambda pair: pair[0]), st.data())
def test_whatever_the_names_no_unseen_one_is_told_and_operators_read_the_words_as_written(models, data):
    shown = [(model, f"«{at}»{words}") for at, (model, words) in enumerate(models)]
    seen = data.draw(st.sets(st.sampled_from([model for model, _ in models])))
    text = f"before {listed(shown)} after"
    assert plain(text) == f"before {' and '.join(said for _, said in shown)} after"
    told_text = told(text, seen.__contains__)
    assert told_text.startswith("before ") and told_text.endswith(" after")
    assert [f"«{at}»" in told_text for at in range(len(shown))] == [model in seen for model, _ in shown]
    unseen = len(shown) - len(seen)
    assert told_text.endswith({0: " after", 1: "another model after"}.get(unseen, f"{unseen} other models after"))


def test_a_key_is_named_to_itself_and_to_operators_and_to_any_other_key_is_another_key():
    beta, alpha = (of_key(key, f"of key {key!r}", "of another key") for key in ("beta", "alpha"))
    text = f"#4 ({beta}) went before #3 ({alpha})"
    assert plain(text) == "#4 (of key 'beta') went before #3 (of key 'alpha')"
    assert told(text, lambda model: True, {"beta"}.__contains__) == "#4 (of key 'beta') went before #3 (of another key)"
    # Seeing every model says nothing of keys: a key named like a model the reader sees is still another key.
    assert told(text, lambda model: True) == "#4 (of another key) went before #3 (of another key)"
    assert told(f"for {named('alpha')}", lambda model: model == "alpha", lambda key: False) == "for alpha"
