"""Texts about a request that name other models or other API keys, told to each reader as far as it may see them.

Why a request waits, what its start stopped, why it was refused, why fair share sent it: these texts are read by
operators, who see every model and every key, and by the key that sent the request, which may be limited to some
models and sees no other key's name. So where such a text names a model or a key it does not write the name but a
mention: the model (or the key), what is said of it to a reader who sees it (its name, with a lease id or an
eviction cost), and what is said to one who does not ("another model", "another key"). A text with mentions is
still a `str` — it travels as one in refusals, queue entries, over Redis and in the rows — and `told` writes it out
for one reader. Operators are told exactly what the text said before mentions existed.

A mention is its JSON between `MARK` and `END`. JSON escapes every control character, so no mention holds either, but
the words around it may (a model ID is any YAML string): a mention is only JSON found between a `MARK` and the
nearest `END` with no mark between, so a mark in a name can neither pair with a mention's own nor show its JSON.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable

MARK, END = "\x1d", "\x1e"  # ASCII's group and record separators
_MENTION = re.compile(f"{MARK}([^{MARK}{END}]*){END}")
ANOTHER_MODEL = "another model"
KEY = "key"  # what a mention of an API key is of (one of a model says nothing: mentions were of models first)


def named(model: str, shown: str | None = None, hidden: str = ANOTHER_MODEL) -> str:
    """`model` mentioned as `shown` (its name by default) to whoever may see it, as `hidden` to anyone else."""
    return _mention([(model, model if shown is None else shown)], "", hidden)


def listed(shown: Iterable[tuple[str, str]], join: str = " and ") -> str:
    """Several models, each as its shown text (model, text), joined by `join`; those a reader may not see come last,
    counted: "another model", "2 other models"."""
    return _mention(list(shown), join, ANOTHER_MODEL)


def of_key(key: str, shown: str, hidden: str) -> str:
    """Words about the API key `key` (whose a request is): `shown` to a reader who may see its name, the key itself
    or an operator; `hidden` to any other."""
    return _mention([(key, shown)], "", hidden, of=KEY)


def told(text: str, sees: Callable[[str], bool], sees_key: Callable[[str], bool] = lambda key: False) -> str:
    """`text` as told to a reader who sees the models `sees` is true of, and the API keys `sees_key` is true of
    (none unless said)."""
    if MARK not in text and END not in text:
        return text
    pieces, at = [], 0
    for found in _MENTION.finditer(text):
        pieces += [_unmarked(text[at:found.start()]), _said(found[1], sees, sees_key)]
        at = found.end()
    return "".join(pieces) + _unmarked(text[at:])


def plain(text: str) -> str:
    """`text` as an operator reads it: every model and key named."""
    return told(text, lambda model: True, lambda key: True)


def _mention(shown: list[tuple[str, str]], join: str, hidden: str, of: str | None = None) -> str:
    mention = {"shown": shown, "join": join, "hidden": hidden} | ({"of": of} if of else {})
    return MARK + json.dumps(mention, ensure_ascii=False) + END


def _unmarked(words: str) -> str:
    """Words between mentions without stray marks (in a model server's error, or a name)."""
    return words.replace(MARK, "").replace(END, "")


def _said(piece: str, sees: Callable[[str], bool], sees_key: Callable[[str], bool]) -> str:
    try:
        mention = json.loads(piece)
        shown, join, hidden = [(str(m), str(t)) for m, t in mention["shown"]], str(mention["join"]), str(mention["hidden"])
        looks = sees_key if mention.get("of") == KEY else sees
    except (ValueError, KeyError, TypeError):
        return piece  # no mention: words between stray marks (a model server's error), kept without them
    said = [text for model, text in shown if looks(model)]
    if unseen := len(shown) - len(said):
        said.append(hidden if unseen == 1 else f"{unseen} other models")
    return join.join(said)
