"""A key's secret: 32 random bytes shown once, stored only as a SHA-256 hash beside a visible prefix.

A slow password hash would add nothing: the secret is random and 256 bits long, so no dictionary
or brute force reaches it, and SHA-256 keeps the check cheap enough to run on every request.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

# What every secret starts with, so a leaked one is recognisable (a scanner, a log search).
SECRET_MARK = "lsk-"
# The mark and 8 characters of the random part: shown in lists, and the row a presented secret is compared with.
PREFIX_LENGTH = len(SECRET_MARK) + 8


def new_secret() -> str:
    return SECRET_MARK + secrets.token_urlsafe(32)


def prefix_of(secret: str) -> str:
    return secret[:PREFIX_LENGTH]


def secret_hash(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8", "surrogateescape")).hexdigest()


def matches(secret: str, stored_hash: str) -> bool:
    """Whether `secret` is the one `stored_hash` was made from, in time that does not depend on where they differ."""
    return hmac.compare_digest(secret_hash(secret).encode(), stored_hash.encode())
