"""A batch input file's lines are checked as the upload streams in: however the bytes are cut into pieces, the
checker accepts the same files and names the same first bad line as when it reads the file whole."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.batches.lines import BadLine, LineChecker


def good(custom_id: str) -> bytes:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/embeddings",
                       "body": {"model": "m", "input": "x"}}).encode()


BAD = [b"{", b"[]", b'{"custom_id": 1}', good("z").replace(b"POST", b"GET"), b"", b"\xff",
       good("z").replace(b"/v1/embeddings", b"/v1/other"), good("z").replace(b'"model": "m"', b'"model": 5')]


def checked(pieces: list[bytes]) -> int | str:
    checker = LineChecker()
    try:
        for piece in pieces:
            checker.feed(piece)
        return checker.finish()
    except BadLine as exc:
        return f"bad {exc.line}"


def cut(data: bytes, points: list[int]) -> list[bytes]:
    marks = sorted({p % (len(data) + 1) for p in points})
    return [data[a:b] for a, b in zip([0, *marks], [*marks, len(data)])]


STORABLE = st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",))


@given(ids=st.lists(st.text(STORABLE, min_size=1, max_size=5), min_size=1, max_size=20),
       bad=st.one_of(st.none(), st.tuples(st.integers(0, 19), st.sampled_from(BAD))),
       points=st.lists(st.integers(0, 10_000), max_size=12), final_newline=st.booleans())
def test_any_cutting_of_the_bytes_gives_the_answer_of_the_whole_file(ids, bad, points, final_newline):
    lines = [good(f"{n}-{i}") for n, i in enumerate(ids)]
    at = None if bad is None else min(bad[0], len(lines))
    if bad is not None:
        lines.insert(at, bad[1])
    data = b"\n".join(lines) + (b"\n" if final_newline else b"")
    whole = checked([data])
    assert checked(cut(data, points)) == whole
    if bad is None:
        assert whole == len(lines)
    elif bad[1] == b"" and at == len(lines) - 1:  # blank lines may end the file: not requests, not bad
        assert whole == len(lines) - 1
    else:
        assert whole == f"bad {at + 1}"


@pytest.mark.parametrize("data, reason", [
    (good("a") + b"\n" + good("a"), "line 2: custom_id 'a' is used by an earlier line"),
    (b"", "line 1: the file has no lines"),
    (good("a") + b"\n\n" + good("b"), "line 2: empty line \\(blank lines may only end the file\\)"),
    (good("a") + b"\n \r\n\n" + good("b") + b"\n\n", "line 2: empty line"),
    (b"\n\r\n  \n", "line 1: the file has no lines"),
    (good("a") + b"\n\x0c\n", "line 2: not valid JSON"),  # a form feed is not JSON's whitespace
    (b"\n".join(good(str(n)) for n in range(50_001)), "line 50001: a batch file holds at most 50000 lines \\(maxBatchFileLines\\)"),
    (good("a").replace(b'"input"', b'"stream": true, "input"'), "line 1: body.stream is not supported in a batch"),
    (good("x" * 256), "line 1: custom_id is longer than 255 characters"),
    (good("a").replace(b'"input": "x"', b'"input": "x", "temperature": NaN'),
     "line 1: not valid JSON: NaN is not a JSON number"),
    (good("a") + b"\n" + good("b").replace(b'"x"', b"[-Infinity]"), "line 2: not valid JSON: -Infinity is not a JSON number"),
    (good("a").replace(b'"x"', b'{"t": [1, -1e999]}'),
     r"line 1: -1e999 is too large a number \(past a double's range, it would be sent as Infinity\)"),
    (good("a\x00b"), "line 1: custom_id holds a NUL or a lone surrogate"),  # sent as \u0000
    (good("\ud800"), "line 1: custom_id holds a NUL or a lone surrogate"),  # sent as \ud800
    (good("a") + b"\n" + good("b" * 8 * 1024 * 1024) + b"\n", f"line 2: longer than {8 * 1024 * 1024} bytes"),
])
def test_what_a_refusal_says(data, reason):
    with pytest.raises(BadLine, match=reason):
        checker = LineChecker()
        checker.feed(data)
        checker.finish()


def test_max_batch_file_lines_sets_the_most_lines():
    checker = LineChecker(max_lines=3)
    checker.feed(b"\n".join(good(str(n)) for n in range(3)))
    assert checker.finish() == 3
    with pytest.raises(BadLine, match=r"line 4: a batch file holds at most 3 lines \(maxBatchFileLines\)"):
        LineChecker(max_lines=3).feed(b"\n".join(good(str(n)) for n in range(4)) + b"\n")


def sized(length: int) -> bytes:
    """A good line of exactly `length` bytes, without its line ending."""
    line = good("a").replace(b'"input": "x"', b'"input": "' + b"x" * (length - len(good("a")) + 1) + b'"')
    assert len(line) == length
    return line


@pytest.mark.parametrize("ending", [b"\n", b"\r\n", b""])
def test_a_line_of_the_most_bytes_is_taken_whatever_ends_it_and_one_byte_more_is_not(ending):
    most = 8 * 1024 * 1024
    checker = LineChecker()
    checker.feed(good("b") + b"\r\n" + sized(most) + ending)
    assert checker.finish() == 2
    with pytest.raises(BadLine, match=f"line 2: longer than {most} bytes"):
        checker = LineChecker()
        checker.feed(good("b") + b"\r\n" + sized(most + 1) + ending)
        checker.finish()


@pytest.mark.parametrize("ending", [b"\n\n", b"\r\n\r\n", b"\n  \n\t\n", b"\n\n\n"])
def test_blank_lines_may_end_the_file_and_are_not_counted(ending):
    checker = LineChecker(max_lines=2)
    checker.feed(good("a") + b"\n" + good("b") + ending)
    assert checker.finish() == 2
