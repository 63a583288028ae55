"""What a batch input file's lines must be: one JSON object per line, `{custom_id, method, url, body}`, as
OpenAI's Batch API takes them. Checked while the upload streams in, so a bad file is refused naming its
first bad line, without ever holding the file whole."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
MAX_LINE_BYTES = 8 * 1024 * 1024  # a line longer than this is refused without being kept whole
MAX_LINES = 50_000  # OpenAI's limit per batch, the default of maxBatchFileLines; it bounds the custom_ids kept
MAX_CUSTOM_ID = 255  # characters: the column that keeps it


class BadLine(ValueError):
    """A line of an input file that is not a usable request; `line` is its number, from 1."""

    def __init__(self, line: int, reason: str) -> None:
        super().__init__(f"line {line}: {reason}")
        self.line = line
        self.reason = reason


@dataclass(frozen=True)
class BatchLine:
    """One request of a batch input file."""

    custom_id: str
    url: str
    body: dict


def parse_line(number: int, raw: bytes) -> BatchLine:
    """The request on line `number` (its bytes without the newline), or BadLine saying what is wrong."""
    try:
        item = json.loads(raw, parse_constant=_not_json, parse_float=_finite)
    except UnicodeDecodeError:
        raise BadLine(number, "not UTF-8") from None
    except _Unsendable as exc:
        raise BadLine(number, str(exc)) from None
    except (ValueError, RecursionError):
        raise BadLine(number, "not valid JSON") from None
    if not isinstance(item, dict):
        raise BadLine(number, "not a JSON object")
    custom_id = item.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        raise BadLine(number, "custom_id must be a non-empty string")
    if len(custom_id) > MAX_CUSTOM_ID:
        raise BadLine(number, f"custom_id is longer than {MAX_CUSTOM_ID} characters")
    if not is_storable_text(custom_id):
        raise BadLine(number, "custom_id holds a NUL or a lone surrogate (\\u0000, \\ud800 …): not storable text")
    if item.get("method") != "POST":
        raise BadLine(number, 'method must be "POST"')
    url = item.get("url")
    if url not in ENDPOINTS:
        raise BadLine(number, f"url must be one of {', '.join(ENDPOINTS)}")
    body = item.get("body")
    if not isinstance(body, dict):
        raise BadLine(number, "body must be a JSON object")
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise BadLine(number, "body.model must be a non-empty string")
    if body.get("stream"):
        raise BadLine(number, "body.stream is not supported in a batch")
    return BatchLine(custom_id, url, body)


class _Unsendable(Exception):
    """A value Python reads that the line's body could not be sent on with."""


def _not_json(constant: str):
    """Python's json reads NaN and Infinity; they are not JSON, and a model server's parser would refuse the
    line's body when it is sent (or worse, read it), so the upload refuses it instead."""
    raise _Unsendable(f"not valid JSON: {constant} is not a JSON number")


def _finite(text: str) -> float:
    """A JSON number too large for a float (1e999) reads as infinity, which would be sent on as `Infinity`."""
    number = float(text)
    if math.isinf(number):
        raise _Unsendable(f"{text} is too large a number (past a double's range, it would be sent as Infinity)")
    return number


def is_blank(raw: bytes) -> bool:
    """A line of JSON's own whitespace only (space, tab, CR, LF): what the JSON reader would skip."""
    return not raw.strip(b" \t\r\n")


def is_storable_text(text: str) -> bool:
    """Whether a database keeps `text` as it is: UTF-8 encodable (no lone surrogate) and without NUL."""
    if "\x00" in text:
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class LineChecker:
    """Feed an input file's bytes in any pieces; each complete line is checked as it arrives (a BadLine for
    the first bad one, or a custom_id seen before). `finish()` checks the last line and says how many there
    were. A final newline is optional, and blank lines may end the file (editors leave them); a blank line
    with a request after it is bad."""

    def __init__(self, max_lines: int = MAX_LINES) -> None:
        self.max_lines = max_lines
        self.lines = 0
        self._blank_from: int | None = None  # the first of the blank lines read last, unless a request followed
        self._partial = bytearray()
        self._ids: set[str] = set()

    def feed(self, data: bytes) -> None:
        start = 0
        while (end := data.find(b"\n", start)) >= 0:
            if len(self._partial) + end - start > MAX_LINE_BYTES + 1:  # one more: a CRLF line's \r
                raise BadLine(self.lines + 1, f"longer than {MAX_LINE_BYTES} bytes")
            self._partial += data[start:end]
            self._check(self._whole_line())
            self._partial.clear()
            start = end + 1
        self._partial += data[start:]
        if len(self._partial) > MAX_LINE_BYTES + 1:
            raise BadLine(self.lines + 1, f"longer than {MAX_LINE_BYTES} bytes")

    def _whole_line(self) -> bytes:
        """The line read so far, ended: at most MAX_LINE_BYTES without its line ending (LF or CRLF)."""
        if len(self._partial) - self._partial.endswith(b"\r") > MAX_LINE_BYTES:
            raise BadLine(self.lines + 1, f"longer than {MAX_LINE_BYTES} bytes")
        return bytes(self._partial)

    def finish(self) -> int:
        if self._partial:
            self._check(self._whole_line())
            self._partial.clear()
        requests = self.lines if self._blank_from is None else self._blank_from - 1
        if requests == 0:
            raise BadLine(1, "the file has no lines")
        return requests

    def _check(self, raw: bytes) -> None:
        self.lines += 1
        raw = raw.removesuffix(b"\r")
        if is_blank(raw):
            self._blank_from = self._blank_from or self.lines
            return
        if self._blank_from is not None:
            raise BadLine(self._blank_from, "empty line (blank lines may only end the file)")
        if self.lines > self.max_lines:
            raise BadLine(self.lines, f"a batch file holds at most {self.max_lines} lines (maxBatchFileLines)")
        line = parse_line(self.lines, raw)
        if line.custom_id in self._ids:
            raise BadLine(self.lines, f"custom_id {line.custom_id!r} is used by an earlier line")
        self._ids.add(line.custom_id)
