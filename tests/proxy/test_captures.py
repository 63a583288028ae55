"""The capture store and recorder: size-bounded, oldest first, credentials redacted, audio/image bodies left out."""

from __future__ import annotations

import pytest

from proxy.upstream.captures import MB, REDACTED, Capture, CaptureRecorder, CaptureStore, parts_for, redacted
from proxy.config.errors import ConfigError
from proxy.config.loader import parse_config


def capture(capture_id: int, size: int) -> Capture:
    return Capture(id=capture_id, req_path="", req_headers={}, req_body=b"x" * size, resp_headers=None, resp_body=None)


def test_the_oldest_captures_go_first_to_make_room():
    store = CaptureStore()
    store.configure(1000 / MB)
    for capture_id in (1, 2, 3):
        assert store.add(capture(capture_id, 400))
    assert [store.has(i) for i in (1, 2, 3)] == [False, True, True]
    assert "evicted to make room" in store.why_missing(1)


def test_a_capture_larger_than_the_buffer_is_refused_without_evicting_others():
    store = CaptureStore()
    store.configure(1000 / MB)
    store.add(capture(1, 600))
    assert not store.add(capture(2, 1001))
    assert store.has(1) and "larger than captureBuffer (1000 bytes)" in store.why_missing(2)


def test_a_smaller_buffer_drops_the_oldest_and_zero_turns_captures_off():
    store = CaptureStore()
    store.configure(1)
    for capture_id in (1, 2, 3):
        store.add(capture(capture_id, 300))
    store.configure(700 / MB)
    assert [store.has(i) for i in (1, 2, 3)] == [False, True, True]
    store.configure(0)
    assert not store.has(3) and not store.add(capture(4, 1))
    assert "captures are off" in store.why_missing(3)


def test_credential_headers_are_redacted_whatever_their_case():
    headers = {"Authorization": "Bearer k", "PROXY-AUTHORIZATION": "Basic x", "cookie": "a=b",
               "Set-Cookie": "c=d", "X-Api-Key": "k", "Api-Key": "azure", "X-Other": "kept"}
    assert redacted(headers) == {**{name: REDACTED for name in list(headers)[:6]}, "X-Other": "kept"}


def test_audio_and_image_routes_leave_their_large_bodies_out():
    store = CaptureStore()
    store.configure(1)
    speech = CaptureRecorder(store, "/v1/audio/speech", parts_for("/v1/audio/speech"), {"x-api-key": "k"}, b'{"input":"hi"}')
    speech.response_started(200, [(b"Content-Type", b"audio/mpeg"), (b"X-LlamaSwap-Request-Id", b"7")])
    speech.response_sent(b"\xff" * 5000)
    speech.finish()
    kept = store.get(7)
    assert kept.req_body == b'{"input":"hi"}' and kept.resp_body is None
    assert kept.req_headers == {"x-api-key": REDACTED} and kept.resp_headers["content-type"] == "audio/mpeg"
    assert parts_for("/v1/images/edits?x=1") == parts_for("/v1/images/edits")


def test_an_answer_other_than_200_keeps_its_headers_not_its_body():
    store = CaptureStore()
    store.configure(1)
    recorder = CaptureRecorder(store, "/v1/chat/completions", parts_for("/v1/chat/completions"), {}, b"{}")
    recorder.ticket_id = 9
    recorder.response_started(503, [(b"content-type", b"application/json")])
    recorder.response_sent(b'{"error": {}}')
    recorder.finish()
    assert store.get(9).resp_body is None and store.get(9).resp_headers == {"content-type": "application/json"}


def test_a_response_growing_past_the_buffer_stops_being_collected_and_is_not_kept():
    store = CaptureStore()
    store.configure(1000 / MB)
    recorder = CaptureRecorder(store, "/v1/chat/completions", parts_for("/v1/chat/completions"), {}, b"{}")
    recorder.response_started(200, [(b"x-llamaswap-request-id", b"3")])
    for _ in range(100):
        recorder.response_sent(b"y" * 100)
    assert sum(map(len, recorder.chunks)) <= 1100
    recorder.finish()
    assert not store.has(3) and "larger than captureBuffer" in store.why_missing(3)


def test_capture_buffer_is_read_in_mb_off_by_default_and_fractions_allowed():
    model = "models:\n  m:\n    cmd: /bin/true --port ${PORT}\n"
    assert parse_config(model).capture_buffer_mb == 0
    assert parse_config("captureBuffer: 0.5\n" + model).capture_buffer_mb == 0.5
    for bad, expected in (("-1", "below the minimum of 0"), ("lots", "expected a number")):
        with pytest.raises(ConfigError) as refused:
            parse_config(f"captureBuffer: {bad}\n" + model)
        assert "captureBuffer" in str(refused.value) and expected in str(refused.value)


def streaming(store: CaptureStore, ticket_id: int) -> CaptureRecorder:
    recorder = CaptureRecorder(store, "/v1/chat/completions", parts_for("/v1/chat/completions"), {}, b"")
    recorder.response_started(200, [(b"x-llamaswap-request-id", str(ticket_id).encode())])
    return recorder


def test_exchanges_being_collected_share_the_buffer_with_the_stored_ones():
    store = CaptureStore()
    store.configure(1000 / MB)
    recorders = [streaming(store, ticket_id) for ticket_id in range(1, 7)]
    for _ in range(3):  # six streams of 300 bytes at once, in 100-byte chunks
        for recorder in recorders:
            recorder.response_sent(b"y" * 100)
            assert sum(len(chunk) for r in recorders for chunk in r.chunks) <= 1000
    for recorder in recorders:
        recorder.finish()
    kept = [ticket_id for ticket_id in range(1, 7) if store.has(ticket_id)]
    assert 1 <= len(kept) <= 3
    left_out = next(ticket_id for ticket_id in range(1, 7) if ticket_id not in kept)
    assert "beside the other exchanges being captured" in store.why_missing(left_out)
    assert store.add(capture(10, 1000))  # every reservation was given back: the whole buffer is free again


def test_an_exchange_being_collected_drops_the_oldest_stored_capture_for_room():
    store = CaptureStore()
    store.configure(1000 / MB)
    store.add(capture(1, 600))
    recorder = streaming(store, 2)
    recorder.response_sent(b"y" * 500)
    assert not store.has(1)
    recorder.finish()
    assert store.get(2).resp_body == b"y" * 500


def test_a_client_leaving_gives_back_what_its_capture_held():
    store = CaptureStore()
    store.configure(1000 / MB)
    left = CaptureRecorder(store, "/v1/chat/completions", parts_for("/v1/chat/completions"), {}, b"x" * 400)
    left.response_sent(b"y" * 500)  # refused before it was queued: no id, nothing stored
    left.finish()
    assert store.add(capture(3, 1000))
