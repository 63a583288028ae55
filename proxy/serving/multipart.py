"""multipart/form-data bodies (RFC 7578): read the text fields, or replace one, without touching the files.

Only boundaries and part headers are examined; file contents are never copied or decoded, so a 30 MB
audio upload costs a few byte searches. Text fields are UTF-8 unless the part's own Content-Type or the
form's `_charset_` field names another charset (RFC 7578 §4.6).
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass
from email.message import Message
from email.parser import BytesHeaderParser
from email.utils import collapse_rfc2231_value

CHARSET_FIELD = "_charset_"
# Blanks a sender may put between a boundary and the end of its line (RFC 2046 "transport padding").
_MAX_PADDING = 64
_HEADERS = BytesHeaderParser()


class MultipartError(ValueError):
    """The body is not a usable multipart/form-data body; the message says what is wrong with it."""


@dataclass(frozen=True)
class Part:
    """One part of the form: its field name, whether it is a file, and where its content lies in the body."""

    name: str | None
    is_file: bool
    charset: str | None
    start: int
    end: int


def boundary_of(content_type: str) -> bytes:
    header = Message()
    header["content-type"] = content_type
    boundary = header.get_param("boundary")
    if isinstance(boundary, tuple):
        boundary = collapse_rfc2231_value(boundary)
    if not boundary:
        raise MultipartError("the Content-Type has no boundary parameter")
    try:
        return boundary.encode("ascii")
    except UnicodeEncodeError:
        raise MultipartError("the boundary in the Content-Type is not ASCII") from None


def split_parts(content_type: str, body: bytes) -> list[Part]:
    """Every part between the first boundary and the closing one (RFC 2046 §5.1.1)."""
    delimiter = b"--" + boundary_of(content_type)
    position = 0 if _is_delimiter(body, delimiter, 0) else _next_delimiter(body, delimiter, 0)
    if position < 0:
        raise MultipartError("the boundary named in the Content-Type never occurs in the body")
    parts: list[Part] = []
    while True:
        after = position + len(delimiter)
        if body.startswith(b"--", after):
            return parts
        head_start = body.index(b"\r\n", after) + 2
        following = _next_delimiter(body, delimiter, head_start)
        if following < 0:
            raise MultipartError("the body ends without its closing boundary")
        if body.startswith(b"\r\n", head_start):
            head_end, content_start = head_start, head_start + 2
        else:
            head_end = body.find(b"\r\n\r\n", head_start, following)
            if head_end < 0:
                raise MultipartError("a part's headers are not followed by a blank line")
            content_start = head_end + 4
        parts.append(_part(body[head_start:head_end], content_start, following - 2))
        position = following


def _is_delimiter(body: bytes, delimiter: bytes, position: int) -> bool:
    """Whether a delimiter line starts at `position`: the boundary, then `--` or blanks up to a CRLF."""
    if not body.startswith(delimiter, position):
        return False
    after = position + len(delimiter)
    if body.startswith(b"--", after):
        return True
    line_end = body.find(b"\r\n", after, after + _MAX_PADDING + 2)
    return line_end >= 0 and not body[after:line_end].strip(b" \t")


def _next_delimiter(body: bytes, delimiter: bytes, start: int) -> int:
    """Where the next delimiter line begins (just after the CRLF that precedes it), or -1."""
    found = body.find(b"\r\n" + delimiter, start)
    while found >= 0 and not _is_delimiter(body, delimiter, found + 2):
        found = body.find(b"\r\n" + delimiter, found + 2)
    return found + 2 if found >= 0 else -1


def _part(head: bytes, start: int, end: int) -> Part:
    headers = _HEADERS.parsebytes(head + b"\r\n\r\n")
    name = headers.get_param("name", header="content-disposition")
    if isinstance(name, tuple):
        name = collapse_rfc2231_value(name)
    charset = headers.get_param("charset")
    return Part(
        name=name if isinstance(name, str) else None,
        is_file=headers.get_param("filename", header="content-disposition") is not None,
        charset=charset if isinstance(charset, str) else None,
        start=start,
        end=max(end, start),
    )


def text_fields(content_type: str, body: bytes) -> dict[str, str]:
    """The form's text fields, decoded; the first of repeated names wins and files are skipped."""
    fields = [part for part in split_parts(content_type, body) if part.name and not part.is_file]
    form_charset = "utf-8"
    for part in fields:
        if part.name == CHARSET_FIELD:
            form_charset = body[part.start:part.end].decode("ascii", "replace").strip()
            break
    values: dict[str, str] = {}
    for part in fields:
        if part.name in values:
            continue
        charset = part.charset or form_charset
        try:
            codecs.lookup(charset)
        except LookupError:
            raise MultipartError(f"form field {part.name!r} names the unknown charset {charset!r}") from None
        try:
            values[part.name] = body[part.start:part.end].decode(charset)
        except UnicodeDecodeError:
            raise MultipartError(f"form field {part.name!r} is not valid {charset}") from None
    return values


def replace_field(content_type: str, body: bytes, name: str, value: str) -> bytes:
    """The body with every text field called `name` set to `value` (UTF-8); every other byte is kept."""
    pieces: list[bytes] = []
    kept_from = 0
    for part in split_parts(content_type, body):
        if part.name == name and not part.is_file:
            pieces += [body[kept_from:part.start], value.encode("utf-8")]
            kept_from = part.end
    pieces.append(body[kept_from:])
    return b"".join(pieces)
