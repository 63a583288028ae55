"""Hostile and broken requests, in-process: each gets a clear OpenAI-shaped error (or is served), never a 500."""

from __future__ import annotations

import json
import sys
from urllib.parse import urlencode

import pytest

from tests.hardening.inprocess import BASE_PATH, BODY_LIMIT
from tests.served import REPO, read_events

# transaction=True: rows are written by the recorder's own thread, so no test may hold a transaction open.
pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.django_db(transaction=True)]

JSON = (b"content-type", b"application/json")
NESTED = 30000  # deeper than Python's JSON parser goes, still under the body limit


def chat_body(**fields) -> bytes:
    return json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}).encode()


@pytest.mark.parametrize("body,code", [
    (b'{"model": "m", "messages": [', "invalid_json"),
    (b'{"model": "m",}', "invalid_json"),
    (b"{'model': 'm'}", "invalid_json"),
    (b"", "invalid_json"),
    (b"   \n", "invalid_json"),
    (b'["m"]', "invalid_json"),
    (b'"m"', "invalid_json"),
    (b"null", "invalid_json"),
    (b'{"model": "m\xff"}', "invalid_encoding"),
    (b"\xfe\xff\x00{", "invalid_encoding"),
    (b"[" * NESTED + b"]" * NESTED, "invalid_json"),
    (b'{"model": "m", "x": ' + b"[" * NESTED + b"]" * NESTED + b"}", "invalid_json"),
    (b'{"model": "m", "x": ' + b'{"a":' * 12000, "invalid_json"),
    (b'{"model": "m", "n": ' + b"7" * 4301 + b"}", "invalid_json"),  # longer than Python reads an integer
    (b"{}", "model_missing"),
    (b'{"model": ""}', "model_missing"),
    (b'{"model": "  \\t"}', "model_missing"),
    (b'{"model": null}', "invalid_model"),
    (b'{"model": 7}', "invalid_model"),
    (b'{"model": ["m"]}', "invalid_model"),
    (b'{"model": {"id": "m"}}', "invalid_model"),
    (b'{"model": true}', "invalid_model"),
])
async def test_unusable_json_bodies_are_400_with_a_reason(app, body, code):
    answer = await app.request("POST", "/v1/chat/completions", body, [JSON])
    assert answer.status == 400, answer.body[:300]
    assert answer.json()["error"]["code"] == code
    assert answer.error_message()


async def test_json_nested_as_deep_as_the_parser_allows_is_still_served(app):
    answer = await app.request("POST", "/v1/chat/completions", chat_body(x=json.loads("[" * 200 + "]" * 200)), [JSON])
    assert answer.status == 200


@pytest.mark.parametrize("model", ["nope", "M", "m ", "../../etc/passwd", "m/../m", "m\x00", "\ud800", "x" * 5000])
async def test_unknown_models_are_404_naming_the_model_list(app, model):
    answer = await app.request("POST", "/v1/chat/completions", json.dumps({"model": model}).encode(), [JSON])
    if model.strip() == "m":
        assert answer.status == 200  # surrounding whitespace is forgiven
        return
    assert answer.status == 404
    assert answer.json()["error"]["code"] == "model_not_found"
    assert "/v1/models" in answer.error_message()


@pytest.mark.parametrize("name", ["$(touch {marker})", "`touch {marker}`", "m; touch {marker}", "m && touch {marker}",
                                  "{marker}"])
async def test_model_names_never_reach_a_shell_or_the_file_system(app, tmp_path, name):
    marker = tmp_path / "created-by-a-model-name"
    model = name.format(marker=marker)
    for route, body, headers in [
        ("/v1/chat/completions", json.dumps({"model": model}).encode(), [JSON]),
        ("/v1/chat/completions", urlencode({"model": model}).encode(),
         [(b"content-type", b"application/x-www-form-urlencoded")]),
    ]:
        answer = await app.request("POST", route, body, headers)
        assert answer.status == 404, answer.body[:300]
    answer = await app.request("GET", "/upstream/" + model.replace(" ", "%20") + "/x")
    assert answer.status == 404
    assert not marker.exists()


@pytest.mark.parametrize("content_type", [None, b"text/plain", b"application/xml", b"application/octet-stream",
                                          b"text/json", b"application/jsonx", b"\xe9\xff"])
async def test_non_json_content_types_are_415(app, content_type):
    headers = [] if content_type is None else [(b"content-type", content_type)]
    answer = await app.request("POST", "/v1/chat/completions", chat_body(), headers)
    assert answer.status == 415
    assert "application/json" in answer.error_message()


@pytest.mark.parametrize("route,content_type,body,status", [
    ("/v1/chat/completions", b"multipart/form-data", b"--x\r\n\r\nm\r\n--x--\r\n", 400),
    ("/v1/audio/transcriptions", b"multipart/form-data", b"--x\r\n\r\nm\r\n--x--\r\n", 400),
    ("/v1/audio/transcriptions", b"multipart/form-data; boundary=x", b"\x00\xff garbage", 400),
    ("/v1/audio/transcriptions", b"multipart/form-data; boundary=x",
     b'--x\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n\r\nRIFF\r\n--x--\r\n', 400),
    ("/v1/audio/transcriptions", b"multipart/form-data; boundary=x",
     b'--x\r\nContent-Disposition: form-data; name="model"\r\n\r\nnope\r\n--x--\r\n', 404),
    ("/v1/audio/transcriptions", b"application/json", chat_body(), 415),
    ("/v1/chat/completions", b"application/x-www-form-urlencoded", b"stream=true", 400),
    ("/v1/chat/completions", b"application/x-www-form-urlencoded", b"model=%ff%fe", 404),
])
async def test_broken_forms_and_multipart_are_clear_errors(app, route, content_type, body, status):
    answer = await app.request("POST", route, body, [(b"content-type", content_type)])
    assert answer.status == status, answer.body[:300]
    assert answer.error_message()


async def test_a_multipart_form_naming_the_model_is_served(app):
    body = b'--x\r\nContent-Disposition: form-data; name="model"\r\n\r\nm\r\n--x--\r\n'
    answer = await app.request("POST", "/v1/audio/transcriptions", body,
                               [(b"content-type", b"multipart/form-data; boundary=x")])
    assert answer.status == 200 and answer.json()["model"] == "m"


async def test_a_body_over_the_limit_is_413_even_when_it_arrives_in_pieces(app):
    pieces = [b" " * 16384] * (BODY_LIMIT // 16384 + 1) + [chat_body()]
    answer = await app.request("POST", "/v1/chat/completions", pieces, [JSON])
    assert answer.status == 413
    assert "maxRequestBodyBytes" in answer.error_message()


async def test_a_body_under_the_limit_arriving_in_pieces_is_served_whole(app):
    body = chat_body(pad=" " * (BODY_LIMIT - 1000))
    answer = await app.request("POST", "/v1/chat/completions", [body[i:i + 1000] for i in range(0, len(body), 1000)],
                               [JSON])
    assert answer.status == 200
    last = [e for e in read_events(app.events) if e["event"] == "start"][-1]
    assert int(last["headers"]["content-length"]) == len(body)


@pytest.mark.parametrize("length", [b"99999999999999999999999", b"-1", b"0", b"abc", b"1e9"])
async def test_the_declared_content_length_is_not_trusted(app, length):
    answer = await app.request("POST", "/v1/chat/completions", chat_body(), [JSON, (b"content-length", length)])
    assert answer.status == 200
    last = [e for e in read_events(app.events) if e["event"] == "start"][-1]
    assert int(last["headers"]["content-length"]) == len(chat_body())


@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE", "PATCH", "TRACE", "FOO"])  # OPTIONS: the CORS preflight
async def test_model_routes_answer_other_methods_with_405(app, method):
    answer = await app.request(method, "/v1/chat/completions", chat_body(), [JSON])
    assert answer.status == 405 and answer.headers[b"allow"] == b"POST"
    assert answer.error_message()


@pytest.mark.parametrize("path,method,allowed", [
    ("/v1/models", "POST", b"GET"),
    ("/models", "DELETE", b"GET"),
    ("/running", "PUT", b"GET"),
    ("/logs", "POST", b"GET"),
    ("/unload", "POST", b"GET"),
    ("/api/models/unload", "GET", b"POST"),
    ("/api/models/unload/m", "DELETE", b"POST"),
    ("/health", "POST", b"GET, HEAD"),
    ("/health", "DELETE", b"GET, HEAD"),
])
async def test_api_views_answer_other_methods_with_a_json_405(app, path, method, allowed):
    answer = await app.request(method, path, b"{}", [JSON])
    assert answer.status == 405
    assert answer.headers[b"allow"] == allowed
    assert answer.json()["error"]["code"] == "method_not_allowed"


@pytest.mark.parametrize("raw_path", ["/v1/chat/completions/../../admin/", "//v1/chat/completions",
                                      "/v1/chat/completions%00", "/v1/%2e%2e/admin/", "/nope\xff"])
async def test_path_tricks_on_model_routes_are_404(app, raw_path):
    answer = await app.request("POST", raw_path, chat_body(), [JSON])
    assert answer.status == 404
    assert answer.json()["error"]["code"] == "route_not_found"


@pytest.mark.parametrize("raw_path", [
    "/static/../x", "/static/../../llamaswap_site/settings.py", "/static/..%2f..%2fmanage.py",
    "/static/%2e%2e/%2e%2e/manage.py", "/static//etc/passwd", "/static/admin/../../../pyproject.toml",
])
async def test_static_files_never_leave_the_static_folders(app, raw_path):
    answer = await app.request("GET", raw_path)
    assert answer.status in (400, 404)  # 400: Django's SuspiciousFileOperation
    assert b"import" not in answer.body and b"[project]" not in answer.body
    # Any client may ask, without a key: the answer names no file or folder of the install.
    message = answer.error_message()
    assert str(REPO) not in message and sys.prefix not in message and "site-packages" not in message
    if answer.status == 400:
        assert message == "bad request: the path leads outside the folder it names"


@pytest.mark.parametrize("raw_path", [
    "/upstream/m/../../x", "/upstream/m/..", "/upstream/m/a/../../x", "/upstream/m/..%2f..%2fx",
    "/upstream/m/%2e%2e/x", "/upstream/m/%2E%2E%2Fx", "/upstream/m/..%5c..%5cx", "/upstream/m/..\\x",
])
async def test_upstream_paths_that_climb_out_of_the_base_url_are_refused(app, raw_path):
    answer = await app.request("GET", raw_path)
    assert answer.status == 400
    assert answer.json()["error"]["code"] == "invalid_path"


@pytest.mark.parametrize("raw_path", ["/upstream/m//evil.example/x", "/upstream/m/@evil.example/x",
                                      "/upstream/m/http://evil.example/", "/upstream/m/%2f%2fevil.example",
                                      "/upstream/m/x#@evil.example", "/upstream/m/%00", "/upstream/m/.../x"])
async def test_upstream_paths_stay_on_the_model_server_under_its_base_url(app, raw_path):
    answer = await app.request("GET", raw_path)
    assert answer.status == 200, answer.body[:300]
    echo = answer.json()
    assert echo["served_by"] == "m" and echo["path"].startswith(BASE_PATH + "/")


@pytest.mark.parametrize("raw_path", ["/upstream/nope/x", "/upstream/../m/x", "/upstream/%2e%2e/m/x",
                                      "/upstream//m/x", "/upstream/http://evil.example/m", "/upstream/m%2fx"])
async def test_upstream_paths_naming_no_model_are_404(app, raw_path):
    answer = await app.request("GET", raw_path)
    assert answer.status == 404
    assert answer.json()["error"]["code"] == "model_not_found"


async def test_a_bare_upstream_model_redirects_within_the_upstream_route(app):
    answer = await app.request("GET", "/upstream/m?next=//evil.example")
    assert answer.status == 308
    assert answer.headers[b"location"] == b"/upstream/m/?next=//evil.example"


@pytest.mark.parametrize("host", [b"evil.example", b"127.0.0.1.evil.example", b"evil.example:8080", b"",
                                  b"localhost@evil.example", b"\xe9"])
async def test_model_routes_refuse_hosts_outside_allowed_hosts(app, host):
    """A web page that rebinds its DNS name to 127.0.0.1 must not get to use the models."""
    answer = await app.request("POST", "/v1/chat/completions", chat_body(), [JSON], host=host)
    assert answer.status == 400
    assert "LLAMASWAP_ALLOWED_HOSTS" in answer.error_message()
    answer = await app.request("GET", "/upstream/m/x", host=host)
    assert answer.status == 400


@pytest.mark.parametrize("host", [b"localhost", b"127.0.0.1:8080", b"[::1]:8080", b"LOCALHOST"])
async def test_model_routes_serve_the_allowed_hosts(app, host):
    answer = await app.request("POST", "/v1/chat/completions", chat_body(), [JSON], host=host)
    assert answer.status == 200


@pytest.mark.parametrize("values,priority", [
    ([b"9" * 10000], 0),
    ([b"-" + b"9" * 10000], 0),
    ([b"9" * 30], 0),
    ([b"1.5"], 0),
    ([b"1e3"], 0),
    ([b"NaN"], 0),
    ([b"\xe9\xff"], 0),
    (["\u0661\u0660\u0660".encode()], 0),  # Arabic-Indic "100", as UTF-8 bytes
    ([b"1_000"], 0),
    ([b"0x10"], 0),
    ([b""], 0),
    ([b"x" * 10000], 0),
    ([b"-9223372036854775808"], -9223372036854775808),
    ([b"9223372036854775808"], 0),
    ([b"-5"], -5),
    ([b"InterActive"], 100),
    ([b"batch", b"interactive"], -100),
    ([b"junk", b"100"], 0),
])
async def test_hostile_priority_headers_are_served_at_their_value_or_0(app, values, priority):
    headers = [(b"x-llamaswap-priority", v) for v in values]
    answer = await app.chat(headers=headers)
    assert answer.status == 200, answer.body[:300]
    row = await app.last_row()
    assert (row.model, row.priority) == ("m", priority)
    seen = [e for e in read_events(app.events) if e["event"] == "start"][-1]
    assert seen["priority"] == values[0].decode("latin-1")  # forwarded as sent


async def test_the_service_still_serves_after_the_hostile_requests(app):
    answer = await app.chat()
    assert answer.status == 200
    echo = answer.json()
    assert (echo["path"], echo["model"], echo["served_by"]) == (f"{BASE_PATH}/v1/chat/completions", "m", "m")
    _, snapshot = app.service.runtime.snapshot
    assert snapshot.waiting == 0 and snapshot.running_tickets == ()
