"""multipart/form-data reading (RFC 7578): boundaries, charsets, and replacing a field byte for byte."""

from __future__ import annotations

import pytest

from proxy.serving.multipart import MultipartError, replace_field, text_fields

CT = 'multipart/form-data; boundary="b-1"'


def body(*parts: bytes, preamble: bytes = b"", epilogue: bytes = b"") -> bytes:
    return preamble + b"".join(b"--b-1\r\n" + part + b"\r\n" for part in parts) + b"--b-1--\r\n" + epilogue


def field(name: str, value: bytes, extra: bytes = b"") -> bytes:
    return f'Content-Disposition: form-data; name="{name}"\r\n'.encode() + extra + b"\r\n" + value


FILE = b'Content-Disposition: form-data; name="file"; filename="a.wav"\r\nContent-Type: audio/wav\r\n\r\n'


def test_text_fields_are_utf_8_and_files_are_skipped():
    form = body(field("model", "モデル".encode()), FILE + b"--b-10 not a boundary\r\n--b-1x neither", field("n", b"2"))
    assert text_fields(CT, form) == {"model": "モデル", "n": "2"}


def test_preamble_epilogue_and_padding_after_a_boundary_are_allowed():
    form = b"ignored\r\n--b-1  \r\n" + field("model", b"m") + b"\r\n--b-1--\r\nignored too"
    assert text_fields(CT, form) == {"model": "m"}


def test_the_charset_field_and_a_parts_own_charset_are_honoured():
    form = body(field("_charset_", b"iso-8859-1"), field("model", "é".encode("latin-1")),
                field("note", "ü".encode("utf-16"), b"Content-Type: text/plain; charset=utf-16\r\n"))
    assert text_fields(CT, form)["model"] == "é"
    assert text_fields(CT, form)["note"] == "ü"


def test_an_rfc_2231_field_name_is_decoded():
    form = body(b"Content-Disposition: form-data; name*=utf-8''mod%C3%A8le\r\n\r\nm")
    assert text_fields(CT, form) == {"modèle": "m"}


def test_the_first_of_repeated_fields_wins():
    assert text_fields(CT, body(field("model", b"a"), field("model", b"b"))) == {"model": "a"}


@pytest.mark.parametrize("content_type,form,reason", [
    ("multipart/form-data", body(field("model", b"m")), "no boundary"),
    ("multipart/form-data; boundary=zz", body(field("model", b"m")), "never occurs"),
    (CT, b"--b-1\r\n" + field("model", b"m"), "closing boundary"),
    (CT, b"--b-1\r\nContent-Disposition: form-data; name=model\r\n--b-1--", "blank line"),
    (CT, body(field("model", b"\xff")), "not valid utf-8"),
    (CT, body(field("_charset_", b"klingon"), field("model", b"m")), "unknown charset"),
])
def test_unusable_forms_say_what_is_wrong(content_type, form, reason):
    with pytest.raises(MultipartError, match=reason):
        text_fields(content_type, form)


def test_replacing_a_field_keeps_every_other_byte():
    audio = b"\x00\r\n--b-\xff" * 1000
    form = body(field("model", b"old"), FILE + audio, field("model", b"again"))
    replaced = replace_field(CT, form, "model", "名前")
    assert replaced == body(field("model", "名前".encode()), FILE + audio, field("model", "名前".encode()))
