"""Texts about a request that name other models, told to each reader as far as it may see them.

Why a request waits, what its start stopped, why it was refused: these texts are read by operators, who see every
model, and by the key that sent the request, which may be limited to some models. So where such a text names a model
it does not write the name but a mention: the model, what is said of it to a reader who sees it (its name, with a
lease id or an eviction cost), and what is said to one who does not ("another model"). A text with mentions is still
a `str` — it travels as one in refusals, queue entries, over Redis and in the rows — and `told` writes it out for one
reader. Operators are told exactly what the text said before mentions existed.

A mention is its JSON between two `MARK`s; JSON escapes every control character, so no name can hold a `MARK`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable

MARK = "\x1d"  # ASCII's group separator: no model name, number or word of ours holds one
ANOTHER_MODEL = "another model"


def named(model: str, shown: str | None = None, hidden: str = ANOTHER_MODEL) -> str:
    """`model` mentioned as `shown` (its name by default) to whoever may see it, as `hidden` to anyone else."""
    return _mention([(model, model if shown is None else shown)], "", hidden)


def listed(shown: Iterable[tuple[str, str]], join: str = " and ") -> str:
    """Several models, each as its shown text (model, text), joined by `join`; those a reader may not see come last,
    counted: "another model", "2 other models"."""
    return _mention(list(shown), join, ANOTHER_MODEL)


def told(text: str, sees: Callable[[str], bool]) -> str:
    """`text` as told to a reader who sees the models `sees` is true of."""
    if MARK not in text:
        return text
    pieces = text.split(MARK)
    for at in range(1, len(pieces) - 1, 2):  # each piece between two marks
        pieces[at] = _said(pieces[at], sees)
    return "".join(pieces)


def plain(text: str) -> str:
    """`text` as an operator reads it: every model named."""
    return told(text, lambda model: True)


def _mention(shown: list[tuple[str, str]], join: str, hidden: str) -> str:
    return MARK + json.dumps({"shown": shown, "join": join, "hidden": hidden}, ensure_ascii=False) + MARK


def _said(piece: str, sees: Callable[[str], bool]) -> str:
    try:
        mention = json.loads(piece)
        shown, join, hidden = [(str(m), str(t)) for m, t in mention["shown"]], str(mention["join"]), str(mention["hidden"])
    except (ValueError, KeyError, TypeError):
        return piece  # no mention: a stray mark in words not ours (a model server's error), left out
    said = [text for model, text in shown if sees(model)]
    if unseen := len(shown) - len(said):
        said.append(hidden if unseen == 1 else f"{unseen} other models")
    return join.join(said)
