"""Who a request comes from, by the key it shows, and what that key may do: pure decisions over the
config file's `apiKeys` and the key rows as last read (`proxy.serving.key_cache` reads them).

A config file apiKey is unrestricted, as before keys had rows. Either kind of key switches the guard on
for every route; with neither, everyone is let in. When the rows cannot be read (the database is away and
the last good read is too old), a row key is refused with 503 rather than guessed at.
"""

from __future__ import annotations

import enum
import hmac
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from proxy.serving.auth import presented_keys
from scheduling.keys.scope import UNRESTRICTED, KeyScope
from scheduling.keys.secrets import matches, prefix_of
from scheduling.keys.store import KeyRows

MISSING_KEY = "missing or wrong API key: send 'Authorization: Bearer <key>' or 'x-api-key: <key>'"


@dataclass(frozen=True)
class Caller:
    """An admitted request's key: `keyed` when keys guard this server, `basic_only` when its key came
    only as Basic credentials (which a browser sends on its own: `proxy.serving.cross_site`)."""

    scope: KeyScope
    keyed: bool = True
    basic_only: bool = False


OPEN = Caller(UNRESTRICTED, keyed=False)


@dataclass(frozen=True)
class Denied:
    """A refusal, as its HTTP status, OpenAI-shaped code and message."""

    status: int
    message: str
    code: str

    def headers(self) -> dict[str, str]:
        """A 401 asks for credentials, so a browser prompts for the key (its password field)."""
        return {"WWW-Authenticate": 'Basic realm="llamaswap"'} if self.status == 401 else {}


class Need(enum.Enum):
    READ = "read"  # /api/* reads, /running, /v1/models, /metrics
    INFERENCE = "inference"  # a model request or socket
    OPERATOR = "operator"  # unload, cancel, profiles, leases, /logs, captures


def identify(headers: Mapping[str, str], config_keys: Sequence[str], rows: KeyRows | None,
             now: datetime) -> Caller | Denied:
    """The caller behind `headers` (lower-case names), or why it is refused. `rows` None: unreadable."""
    if not config_keys and rows is not None and rows.count == 0:
        return OPEN
    everything = presented_keys(headers)
    outside_basic = presented_keys(headers, basic=False)
    refused: str | None = None
    for shown, basic_only in ((outside_basic, False), (everything[len(outside_basic):], True)):
        for secret in shown:
            found = _scope_of(secret, config_keys, rows, now)
            if isinstance(found, KeyScope):
                return Caller(found, basic_only=basic_only)
            refused = refused or found
    if refused:
        return Denied(401, refused, "invalid_api_key")
    if rows is None and (everything or not config_keys):
        return Denied(503, "the API key table cannot be read (the database is unreachable); try again",
                      "key_store_unavailable")
    return Denied(401, MISSING_KEY, "invalid_api_key")


def _scope_of(secret: str, config_keys: Sequence[str], rows: KeyRows | None, now: datetime) -> KeyScope | str | None:
    """The scope of the key `secret` is, why that key is refused, or None when it is no key."""
    candidate = secret.encode("utf-8", "surrogateescape")
    in_config = False
    for key in config_keys:  # every pair, so timing does not tell which key (or how much of it) matched
        in_config |= hmac.compare_digest(candidate, key.encode())
    if in_config:
        return UNRESTRICTED
    for stored in () if rows is None else rows.by_prefix.get(prefix_of(secret), ()):
        if matches(secret, stored.secret_hash):
            return stored.refusal(now) or stored.scope
    return None


def route_refusal(caller: Caller, need: Need) -> Denied | None:
    """Why the caller's key may not do what `need` names, else None."""
    scope = caller.scope
    if need is Need.OPERATOR and not scope.operator:
        return Denied(403, f"the API key '{scope.name}' is not an operator key: unloading, cancelling, profiles, "
                           "leases, /logs and captures need one", "operator_key_required")
    if need is Need.INFERENCE and scope.read_only:
        return Denied(403, f"the API key '{scope.name}' is read-only: it sends no requests to models", "key_read_only")
    return None


def model_refusal(caller: Caller, model: str, asked: str | None = None) -> Denied | None:
    """Why the caller's key may not use `model` (a model ID, or a peer's `<peer>/<model>`), else None; the refusal
    names the model as asked (`asked`: what led to `model`, an alias, a selector, a pin), never one outside it."""
    if caller.scope.allows_model(model):
        return None
    return Denied(403, f"the API key '{caller.scope.name}' may not use model '{asked or model}'", "model_not_allowed")
