"""Token counts come from the end of a stream, however the relay batched what it kept of it."""

import json

from proxy.upstream.usage import usage_from_sse


def event(payload) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def test_usage_in_the_final_events_is_found_behind_thousands_of_token_events_in_one_piece():
    tokens = b"".join(event({"choices": [{"delta": {"content": f"t{i} "}}]}) for i in range(5000))
    final = event({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 5000}}) + b"data: [DONE]\n\n"
    usage = usage_from_sse([tokens, tokens + final[:10], final[10:]])
    assert usage == {"input_tokens": 7, "output_tokens": 5000}


def test_usage_and_timings_from_separate_events_both_count_and_the_last_one_wins():
    tail = [event({"usage": {"prompt_tokens": 1, "completion_tokens": 1}}),
            event({"usage": {"prompt_tokens": 3, "completion_tokens": 4}}),
            event({"timings": {"predicted_per_second": 12.5}})]
    assert usage_from_sse(tail) == {"input_tokens": 3, "output_tokens": 4, "tokens_per_second": 12.5}


def test_a_stream_whose_lines_end_with_a_bare_carriage_return_is_read_too():
    tail = [b"data: {\"a\": 1}\r\r" * 3000, b"data: {\"usage\": {\"completion_tokens\": 9}}\r\r"]
    assert usage_from_sse(tail) == {"output_tokens": 9}


def test_an_event_nested_too_deeply_to_parse_gives_no_counts_and_no_error():
    nested = b'data: {"usage": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n\n"
    assert usage_from_sse([event({"usage": {"completion_tokens": 2}}), nested]) == {"output_tokens": 2}
