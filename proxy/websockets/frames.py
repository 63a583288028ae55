"""RFC 6455 framing: the handshake key, and encoding and decoding single frames.

Standard library only: the fake model server imports it too, and it starts in milliseconds.
"""

from __future__ import annotations

import base64
import hashlib
import os
import struct

_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

CONTINUATION, TEXT, BINARY, CLOSE, PING, PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA
CONTROL_OPCODES = frozenset({CLOSE, PING, PONG})
NO_STATUS = 1005  # a close frame without a code (RFC 6455 7.4.1); never sent on the wire
NORMAL_CLOSURE = 1000
MESSAGE_TOO_BIG = 1009


def new_key() -> str:
    """A client's Sec-WebSocket-Key."""
    return base64.b64encode(os.urandom(16)).decode()


def accept_key(key: str) -> str:
    """The Sec-WebSocket-Accept a server answers `key` with."""
    return base64.b64encode(hashlib.sha1(key.encode() + _GUID).digest()).decode()


def unmask(payload: bytes, mask: bytes) -> bytes:
    """XOR with the 4-byte mask (masking and unmasking are the same operation)."""
    if not payload:
        return payload
    repeated = (mask * (len(payload) // 4 + 1))[: len(payload)]
    return (int.from_bytes(payload, "big") ^ int.from_bytes(repeated, "big")).to_bytes(len(payload), "big")


def encode_frame(opcode: int, payload: bytes, *, masked: bool, fin: bool = True) -> bytes:
    """One frame; a client's frames must be masked, a server's must not."""
    head = bytes([(0x80 if fin else 0) | opcode])
    length = len(payload)
    mask_bit = 0x80 if masked else 0
    if length < 126:
        head += bytes([mask_bit | length])
    elif length < 1 << 16:
        head += bytes([mask_bit | 126]) + struct.pack("!H", length)
    else:
        head += bytes([mask_bit | 127]) + struct.pack("!Q", length)
    if not masked:
        return head + payload
    mask = os.urandom(4)
    return head + mask + unmask(payload, mask)


def close_payload(code: int, reason: str = "") -> bytes:
    """A close frame's body: the code, then a UTF-8 reason cut to fit the 125-byte control frame limit."""
    if code == NO_STATUS:
        return b""
    return struct.pack("!H", code) + reason.encode()[:123]


def parse_close(payload: bytes) -> tuple[int, str]:
    if len(payload) < 2:
        return NO_STATUS, ""
    return struct.unpack("!H", payload[:2])[0], payload[2:].decode("utf-8", "replace")


def frame_header(first: bytes) -> tuple[bool, int, bool, int]:
    """(fin, opcode, masked, length code) from a frame's first two bytes; the length code 126 or 127
    says 2 or 8 more bytes hold the real length."""
    return bool(first[0] & 0x80), first[0] & 0x0F, bool(first[1] & 0x80), first[1] & 0x7F


def extended_length_size(length_code: int) -> int:
    return {126: 2, 127: 8}.get(length_code, 0)


def extended_length(data: bytes) -> int:
    return struct.unpack("!H" if len(data) == 2 else "!Q", data)[0]
