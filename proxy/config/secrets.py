"""What the config holds that must never be shown, and how a value is shown without it.

Config problems, the start-up summary, logs, rows and error answers are read by people who may not
hold the keys (an answer to any client, a log shipped elsewhere), so a key's value never appears in
them: a problem names the key path and the fix instead, and a URL keeps everything but its userinfo.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit

from .errors import kind_of

# The key paths whose values are credentials: the proxy's own keys, each peer's key, and a model's
# `env` entries (HF_TOKEN=…, OPENAI_API_KEY=…: any of them may be one).
_SECRET_KEY = re.compile(r"apiKeys(\[\d+\])?|peers\..+\.apiKey|models\..+\.env(\[\d+\])?")
HIDDEN_USERINFO = "***"
HIDDEN_VALUE = "***"
# Command-line flags whose value is a credential: llama-server's --api-key, Hugging Face tokens and the like.
_SECRET_FLAG = re.compile(r"--?([\w-]*[-_])?(api[-_]?key|token|password|passwd|secret)", re.IGNORECASE)
# The same flags inside one argument that is a whole script (`sh -c "… --api-key K"`): the flag, what
# separates it from its value, an opening quote, and the value.
_SECRET_FLAG_IN_SCRIPT = re.compile(
    r"(?<![\w-])(--?(?:[\w-]*[-_])?(?:api[-_]?key|token|password|passwd|secret))(=|\s+)(['\"]?)([^\s'\"]+)",
    re.IGNORECASE,
)


def placeholder(key: str) -> str:
    """What a problem about secret key path `key` writes where the value would go."""
    return '<NAME=value>' if ".env" in key else "<the key>"


def is_secret(key: str) -> bool:
    """Whether the value at config key path `key` is a credential."""
    return _SECRET_KEY.fullmatch(key) is not None


def described(key: str, value: object) -> str:
    """`value` in words for an "expected X, got Y" problem: its kind alone when `key` is secret."""
    if not is_secret(key):
        return kind_of(value)
    if isinstance(value, bool):
        return "a bool"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return kind_of(value)  # a list, a mapping, null: nothing of the value is in the words


def shown_url(url: str) -> str:
    """`url` as it may be shown anywhere (answers, rows, logs, the start-up summary): any
    `user:password@` is replaced by `***@`, so a credential written into a URL stays in the config."""
    try:
        parts = urlsplit(url)
    except ValueError:  # unparsable: hide whatever precedes the last '@' of the authority
        return re.sub(r"//[^/?#]*@", f"//{HIDDEN_USERINFO}@", url)
    if "@" not in parts.netloc:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{HIDDEN_USERINFO}@{host}"))


def hidden_values(argv: list[str] | tuple[str, ...]) -> tuple[bytes, ...]:
    """The credential values `shown_argv` hides, as bytes: a model server may print its own
    command line (an argument error), and its output reaches logs, rows and answers."""
    values = set()
    for arg, shown in zip(argv, shown_argv(argv)):
        if shown == arg:
            continue
        if _is_script(arg):
            values.update(m.group(4).encode() for m in _SECRET_FLAG_IN_SCRIPT.finditer(arg) if len(m.group(4)) >= 4)
            continue
        flag, equals, value = arg.partition("=")
        secret = value if equals and shown.startswith(flag + "=") else arg
        if len(secret) >= 4:  # shorter ones would mask ordinary output
            values.add(secret.encode())
    return tuple(sorted(values, key=len, reverse=True))


def scrubbed(output: bytes, values: tuple[bytes, ...]) -> bytes:
    """`output` with each of `values` (from `hidden_values`) replaced by ***."""
    for value in values:
        output = output.replace(value, HIDDEN_VALUE.encode())
    return output


def shown_argv(argv: list[str] | tuple[str, ...]) -> list[str]:
    """A model's command line as it may be shown (`/running`, the start-up summary, the log): the value
    of a credential flag (`--api-key K`, `--hf-token=T`) is hidden, and so is any URL's userinfo."""
    shown: list[str] = []
    hide_next = False
    for arg in argv:
        flag, equals, value = arg.partition("=")
        if hide_next:
            shown.append(HIDDEN_VALUE)
            hide_next = False
        elif _SECRET_FLAG.fullmatch(flag):
            shown.append(f"{flag}={HIDDEN_VALUE}" if equals else arg)
            hide_next = not equals
        elif _is_script(arg):
            hidden = _SECRET_FLAG_IN_SCRIPT.sub(lambda m: m.group(1) + m.group(2) + m.group(3) + HIDDEN_VALUE, arg)
            shown.append(re.sub(r"(\w://)[^/?#\s@]*@", rf"\1{HIDDEN_USERINFO}@", hidden))
        else:
            shown.append(shown_url(arg) if "://" in arg else arg)
    return shown


def _is_script(arg: str) -> bool:
    """An argument with spaces in it: a shell script (`sh -c`), read word by word."""
    return any(c.isspace() for c in arg)
