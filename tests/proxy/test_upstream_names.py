"""The model names an /upstream path may begin with: the longest run of segments first, as joining the
segments did, but only runs a configured name could match."""

from hypothesis import given
from hypothesis import strategies as st

from proxy.serving.upstream_names import leading_names


def joined_runs(rest: str) -> list[tuple[str, str | None]]:
    """Every run of leading segments, longest first, by joining them (the obvious reading, quadratic)."""
    segments = rest.split("/")
    return [
        ("/".join(segments[:end]), "/".join(segments[end:]) if end < len(segments) else None)
        for end in range(len(segments), 0, -1)
    ]


@given(st.text(alphabet="ab/.", max_size=30), st.integers(min_value=0, max_value=35))
def test_the_runs_are_the_joined_segments_no_longer_than_the_longest_name(rest, longest):
    assert list(leading_names(rest, longest)) == [run for run in joined_runs(rest) if len(run[0]) <= longest]


def test_a_path_of_thousands_of_slashes_yields_only_runs_a_name_could_match():
    runs = list(leading_names("/" * 16_000 + "ws", 12))
    assert len(runs) == 13 and runs[0] == ("/" * 12, "/" * 15_987 + "ws") and runs[-1] == ("", "/" * 15_999 + "ws")


def test_a_percent_encoded_name_is_decoded_and_what_follows_is_left_as_sent():
    assert next(leading_names("my%20model/v1/a%20b", 8)) == ("my model", "v1/a%20b")
    assert next(leading_names("org%2Fmodel/v1", 9)) == ("org/model", "v1")
    assert list(leading_names("%2F" * 5000 + "/x", 4)) == []  # longer than any name, decoded or not


def test_a_model_id_with_slashes_and_the_path_after_it():
    assert next(leading_names("org/model/v1/models", 9)) == ("org/model", "v1/models")
    assert list(leading_names("org/model", 9))[0] == ("org/model", None)
