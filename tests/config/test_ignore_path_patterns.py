"""upstream.ignorePaths patterns are searched without their redundant leading `.*`.

Python's `re` backtracks: `.*\\.js$` searched in a 16 000-character path of dots retries the `.*`
from every start, which held the event loop (and /health) for seconds. Without the prefix the
search is linear, and it finds a match exactly where the pattern as written does.
"""

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.config.upstream_paths import DEFAULT_IGNORE_PATHS, compile_path_pattern, is_ignored

DEFAULT_AS_WRITTEN = r".*\.(js|json|css|png|gif|jpg|jpeg|ico|txt)$"

# Patterns whose leading `.*` is redundant for a search, including the cases where it looks like it
# might not be: a newline (`.` does not match it), anchors and lookbehinds after the prefix,
# alternation at the top level, a lazy or doubled prefix.
STRIPPABLE = [DEFAULT_AS_WRITTEN, r".*/static/", r".*?\.map$", r".*^/x", r".*|zz", r".*.*\.js",
              r".*\n.", r".*(?<=/)a", r".*\Ax", r".*(a)\1", r".*"]
# A `.*` followed by a quantifier or a brace is left as written.
KEPT = [r".*+\.js", r".*{x", r"^.*\.js$", r"\.*x"]

paths = st.text(alphabet="/.ajsxz\n?1", max_size=40).map(lambda rest: "/" + rest)


def test_the_default_pattern_has_no_leading_wildcard():
    (pattern,) = DEFAULT_IGNORE_PATHS
    assert not pattern.pattern.startswith(".")
    assert pattern.pattern == r"\.(js|json|css|png|gif|jpg|jpeg|ico|txt)$"


def test_a_long_path_of_dots_is_searched_with_the_stripped_pattern():
    path = "/" + "." * 16000 + "x"
    assert not is_ignored(path, DEFAULT_IGNORE_PATHS)
    assert is_ignored(path + ".js", DEFAULT_IGNORE_PATHS)


@pytest.mark.parametrize("text", STRIPPABLE)
def test_a_redundant_leading_wildcard_is_dropped(text):
    assert not compile_path_pattern(text).pattern.startswith(".*")


@pytest.mark.parametrize("text", KEPT)
def test_a_wildcard_that_is_not_a_redundant_prefix_is_kept(text):
    assert compile_path_pattern(text).pattern == text


@settings(max_examples=400, deadline=None)
@given(path=paths)
def test_stripping_never_changes_which_paths_match(path):
    for text in STRIPPABLE + KEPT:
        assert bool(re.search(text, path)) is is_ignored(path, (compile_path_pattern(text),)), (text, path)


def test_an_invalid_pattern_is_reported_as_written():
    with pytest.raises(re.error) as raised:
        compile_path_pattern(".*(unclosed")
    assert raised.value.pattern == ".*(unclosed"
