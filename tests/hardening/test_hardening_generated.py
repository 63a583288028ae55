"""Generated hostile requests against the in-process application (hypothesis).

Whatever arrives, the answer is JSON with an expected status, an error has `error.message`, nothing is a
500, nothing hangs (every answer has a deadline), and the service keeps serving afterwards.
"""

from __future__ import annotations

import json
import re
from urllib.parse import unquote

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from proxy.serving.inbound import JSON_ROUTES
from tests.hardening.inprocess import BASE_PATH, BODY_LIMIT

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.django_db(transaction=True)]


def generated(examples: int):
    return settings(
        max_examples=examples,
        deadline=None,  # a request's time depends on the machine; ANSWER_TIMEOUT bounds it instead
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )


WHITESPACE = " \t\r\n\f\v"

# What daphne hands the application as a header value: any byte but NUL, CR, LF, VT and FF (it answers
# those with its own 400), without surrounding blanks.
header_values = st.text(
    st.characters(min_codepoint=1, max_codepoint=0xFF, exclude_characters="\r\n\x0b\x0c"), max_size=64
).map(lambda text: text.strip(" \t").encode("latin-1"))
header_names = st.sampled_from(
    [b"x-api-key", b"authorization", b"cookie", b"accept-encoding", b"expect", b"connection", b"te", b"trailer",
     b"transfer-encoding", b"upgrade", b"content-length", b"x-forwarded-for", b"x-forwarded-proto", b"via"]
) | st.from_regex(rb"\A[a-z0-9!#$%&'*+.^_`|~-]{1,24}\Z")

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=16),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
# Body keys the fake model server acts on (a generation length, a crash, a stream) are left out.
extra_fields = st.dictionaries(
    st.text(max_size=12).filter(lambda k: k not in {"model", "fake", "stream", "max_tokens", "n_predict"}),
    json_values, max_size=4,
)
model_values = st.sampled_from(["m", "m-alias", " m\t", "", " ", "nope", "../m", "M"]) | json_values


@st.composite
def model_objects(draw) -> bytes:
    payload = draw(extra_fields)
    if draw(st.booleans()):
        payload["model"] = draw(model_values)
    return json.dumps(payload).encode()  # NaN and Infinity included: Python's parser accepts them


@st.composite
def damaged(draw) -> bytes:
    """A valid request cut short, with a byte changed, or with bytes that are not UTF-8."""
    body = draw(model_objects())
    cut = draw(st.integers(0, len(body)))
    mode = draw(st.sampled_from(["truncate", "flip", "insert"]))
    if mode == "truncate":
        return body[:cut]
    if mode == "flip":
        return body[:cut] + bytes([draw(st.integers(0, 255))]) + body[cut + 1:]
    return body[:cut] + draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x00", b"\\u"])) + body[cut:]


@st.composite
def nested(draw) -> bytes:
    depth = draw(st.integers(1, 30000))
    opener, closer = draw(st.sampled_from([(b"[", b"]"), (b'{"a":', b"}")]))
    inner = b'{"model": "m"}' if opener == b"[" else b"1"
    wrapped = draw(st.booleans())
    closed = draw(st.booleans())
    body = opener * depth + inner + (closer * depth if closed else b"")
    return b'{"model": "m", "x": ' + body + (b"}" if closed else b"") if wrapped else body


oversized = st.integers(BODY_LIMIT + 1, BODY_LIMIT + 4096).map(lambda n: b'{"model": "m", "pad": "' + b"x" * n + b'"}')

multipart = st.builds(
    lambda name, value, tail: (
        b'--xyz\r\nContent-Disposition: form-data; name="' + name + b'"\r\n\r\n' + value + b"\r\n--xyz" + tail
    ),
    st.sampled_from([b"model", b"file", b"", b'model"; filename="a']),
    st.sampled_from([b"m", b"nope", b"", b"\xff"]) | st.binary(max_size=16),
    st.sampled_from([b"--\r\n", b"", b"\r\n"]),
)

bodies = st.one_of(
    st.binary(max_size=256),
    json_values.map(lambda v: json.dumps(v).encode()),
    model_objects(),
    damaged(),
    nested(),
    oversized,
    multipart,
    st.builds(lambda model: b"model=" + model, st.sampled_from([b"m", b"nope", b"%ff", b""])),
)
content_types = st.sampled_from(
    [b"application/json", b"application/json; charset=utf-8", b"APPLICATION/JSON", b"application/vnd.api+json",
     b"text/plain", b"", b"application/x-www-form-urlencoded", b"multipart/form-data",
     b"multipart/form-data; boundary=xyz", b'multipart/form-data; boundary=""', b"multipart/mixed; boundary=xyz"]
) | header_values


def assert_answered_clearly(answer, expected: set[int]) -> None:
    assert answer.status in expected, (answer.status, answer.body[:300])
    if answer.status >= 400:
        assert answer.error_message()


@generated(400)
@given(route=st.sampled_from(sorted(JSON_ROUTES)), content_type=st.none() | content_types, body=bodies)
async def test_generated_bodies_get_clear_answers(app, case_counts, route, content_type, body):
    case_counts["bodies"] = case_counts.get("bodies", 0) + 1
    headers = [] if content_type is None else [(b"content-type", content_type)]
    answer = await app.request("POST", route, body, headers)
    # 200 and an upstream 400 come from the model server: the request was well-formed enough to forward.
    # 502: JSON nested almost as deep as Python's parser goes is forwarded, and the fake model server,
    # parsing it on a deeper stack, drops the connection; llamaswap says the model could not be reached.
    assert_answered_clearly(answer, {200, 400, 404, 413, 415, 502})
    if answer.status == 200:
        assert answer.json()["served_by"] == "m"
    if answer.status == 502:
        assert answer.json()["error"]["code"] == "upstream_unreachable"


def spec_priority(value: bytes) -> int:
    """README's rule: a signed 64-bit integer or an alias, surrounding whitespace ignored; anything else is 0."""
    text = value.decode("latin-1").strip(WHITESPACE)
    aliases = {"interactive": 100, "normal": 0, "batch": -100}
    if text.lower() in aliases:
        return aliases[text.lower()]
    if not re.fullmatch(r"[+-]?[0-9]+", text) or len(text.lstrip("+-").lstrip("0")) > 19:
        return 0
    number = int(text)
    return number if -(2**63) <= number < 2**63 else 0


priority_values = st.one_of(
    st.integers().map(lambda n: str(n).encode()),
    st.integers(-(2**70), 2**70).map(lambda n: f"{n:+d}".encode()),
    st.from_regex(rb"\A[+-]?0{0,20}[0-9]{1,25}\Z"),
    st.integers(1, 10240).map(lambda n: b"9" * n),
    st.floats().map(lambda f: repr(f).encode()),
    st.builds(lambda alias, case, pad: pad + (alias.upper() if case else alias) + pad,
              st.sampled_from([b"interactive", b"normal", b"batch", b"interactiv", b"batches"]), st.booleans(),
              st.sampled_from([b"", b" ", b"\t"])),
    st.text(max_size=8).map(lambda t: t.encode()),  # UTF-8 bytes: mojibake once read as latin-1
    header_values,
).filter(lambda value: not any(byte in value for byte in b"\x00\r\n\x0b\x0c"))


@generated(250)
@given(priorities=st.lists(priority_values, min_size=1, max_size=3),
       others=st.lists(st.tuples(header_names, header_values), max_size=6))
async def test_generated_headers_never_stop_a_request_being_served(app, case_counts, priorities, others):
    case_counts["headers"] = case_counts.get("headers", 0) + 1
    priorities = [p.strip(b" \t") for p in priorities]
    headers = [(b"x-llamaswap-priority", p) for p in priorities] + others
    answer = await app.chat(headers=headers)
    assert answer.status == 200, answer.body[:300]
    assert answer.json()["served_by"] == "m"
    row = await app.last_row()
    assert row.priority == spec_priority(priorities[0])


segments = st.sampled_from(
    [".", "..", "%2e", "%2E%2e", ".%2e", "%2f", "%2F", "%5c", "\\", "@", ":", "evil.example", "http:", "", "%00",
     "%ff", "#", "a", "~", ";", "%252e%252e", "...", "m", "%20", "%"]
) | st.from_regex(r"\A[!-~]{0,8}\Z").filter(lambda s: "?" not in s)


@generated(300)
@given(model=st.sampled_from(["m", "m-alias", "nope", "", "..", "%2e%2e", "m%2f", "M"]),
       rest=st.none() | st.lists(segments, max_size=6).map("/".join),
       query=st.none() | st.from_regex(r"\A[!-~]{0,16}\Z"),
       method=st.sampled_from(["GET", "POST"]), body=st.binary(max_size=64))
async def test_generated_upstream_paths_stay_below_the_models_base_url(app, case_counts, model, rest, query, method,
                                                                       body):
    case_counts["upstream paths"] = case_counts.get("upstream paths", 0) + 1
    raw = "/upstream/" + model + ("" if rest is None else "/" + rest) + ("" if query is None else "?" + query)
    # The fake model server leaves a GET's body unread on its keep-alive connection, so GETs carry none.
    answer = await app.request(method, raw, body if method == "POST" else b"")
    assert_answered_clearly(answer, {200, 308, 400, 404})
    if answer.status == 308:
        assert answer.headers[b"location"].startswith(b"/upstream/")
    if answer.status == 200:
        echo = answer.json()
        assert echo["served_by"] == "m"
        assert echo["path"] == BASE_PATH or echo["path"].startswith((BASE_PATH + "/", BASE_PATH + "?"))
        assert ".." not in re.split(r"[/\\]", unquote(echo["path"].split("?", 1)[0]))


API_ROUTES = {
    "/v1/chat/completions": {"POST"},
    "/v1/models": {"GET"},
    "/models": {"GET"},
    "/running": {"GET"},
    "/logs": {"GET"},
    "/unload": {"GET"},
    "/api/models/unload": {"POST"},
    "/api/models/unload/m": {"POST"},
    "/health": {"GET", "HEAD"},
}


@generated(100)
@given(path=st.sampled_from(sorted(API_ROUTES)), method=st.from_regex(r"\A[A-Z]{1,10}\Z"))
async def test_generated_methods_get_a_json_405_naming_the_allowed_ones(app, case_counts, path, method):
    assume(method not in API_ROUTES[path] | {"HEAD"})  # allowed ones do real work (/unload); HEAD has no body
    case_counts["methods"] = case_counts.get("methods", 0) + 1
    answer = await app.request(method, path, b"{}", [(b"content-type", b"application/json")])
    assert answer.status == 405
    assert set(answer.headers[b"allow"].decode().split(", ")) == API_ROUTES[path]
    assert answer.error_message()


async def test_the_service_still_serves_after_the_generated_requests(app):
    answer = await app.chat(headers=[(b"x-llamaswap-priority", b"interactive")])
    assert answer.status == 200 and answer.json()["served_by"] == "m"
    assert (await app.last_row()).priority == 100
    _, snapshot = app.service.runtime.snapshot
    assert snapshot.waiting == 0 and snapshot.running_tickets == ()
