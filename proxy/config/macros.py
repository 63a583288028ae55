"""Config macros: `${name}` references to values declared under `macros:`.

Rules (as in llama-swap): names match `[A-Za-z0-9_-]`, are shorter than 64
characters and are not one of the reserved names. Values are strings, numbers
or bools. A macro may refer to macros declared before it, never to itself.
Model macros override global macros of the same name *in place*, so a global
macro that mentions the overridden one sees the model's value (late binding).

A value that is exactly `${name}` takes the macro's own type (int, float,
bool); a reference inside a longer string is formatted as text.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from .errors import ProblemLog, kind_of

MACRO_REF = re.compile(r"\$\{([A-Za-z0-9_-]+)\}")
ANY_REF = re.compile(r"\$\{[^}]*\}")
MACRO_NAME = re.compile(r"[A-Za-z0-9_-]+")
MAX_NAME_LENGTH = 63
RESERVED = ("MODEL_ID", "PORT", "PID", "GPUS")


class MacroCycle(Exception):
    """Two or more macros refer to each other through a model override."""


def format_macro_value(value: Any) -> str:
    """Text form of a macro value inside a longer string (bools as YAML writes them)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


class MacroScope:
    """The macros visible at one place in the config, in declaration order."""

    def __init__(self, values: Mapping[str, Any] | None = None):
        self._values: dict[str, Any] = dict(values or {})

    @classmethod
    def declare(cls, block: Any, key: str, log: ProblemLog, parent: MacroScope | None = None) -> MacroScope:
        """Check a `macros:` block and return the scope it makes on top of `parent`.

        Invalid entries are logged and left out, so later references to them
        are reported where they are used.
        """
        merged = dict(parent._values) if parent else {}
        if block is None:
            return cls(merged)
        if not isinstance(block, dict):
            log.error(key, f"must be a mapping of name: value, got {kind_of(block)} — e.g. `{key.split('.')[-1]}: {{ctx: 4096}}`")
            return cls(merged)
        declared_here: set[str] = set()
        for raw_name, value in block.items():
            name = str(raw_name)
            entry_key = f"{key}.{name}"
            if _check_declaration(name, value, entry_key, log):
                for ref in MACRO_REF.findall(value) if isinstance(value, str) else ():
                    if ref in RESERVED or ref in declared_here:
                        continue
                    if parent is not None and ref in parent._values:
                        continue
                    later = ref in {str(other) for other in block}
                    reason = "is declared after it" if later else "is not declared"
                    fix = f"move {ref} above {name}" if later else f"declare {ref} before {name}"
                    log.error(entry_key, f"refers to ${{{ref}}}, which {reason} — {fix}")
                    break
                else:
                    merged[name] = value
            declared_here.add(name)
        return cls(merged)

    def with_value(self, name: str, value: Any) -> MacroScope:
        """A copy of this scope where `name` (a reserved name such as PORT) is known."""
        values = dict(self._values)
        values[name] = value
        return MacroScope(values)

    def expand(self, value: Any, *, typed: bool = True) -> Any:
        """Replace references in every string of `value` (mapping keys are left alone).

        With `typed`, a string that is exactly one reference becomes the macro's
        native value; otherwise references are formatted into the text.
        Raises MacroCycle when macros refer to each other.
        """
        if isinstance(value, str):
            return self._expand_text(value, typed, ())
        if isinstance(value, dict):
            return {key: self.expand(item, typed=typed) for key, item in value.items()}
        if isinstance(value, list):
            return [self.expand(item, typed=typed) for item in value]
        return value

    def _expand_text(self, text: str, typed: bool, chain: tuple[str, ...]) -> Any:
        whole = MACRO_REF.fullmatch(text)
        if typed and whole and whole.group(1) in self._values:
            return self._resolve(whole.group(1), chain)

        def replace(match: re.Match) -> str:
            name = match.group(1)
            if name not in self._values:
                return match.group(0)
            return format_macro_value(self._resolve(name, chain))

        return MACRO_REF.sub(replace, text)

    def _resolve(self, name: str, chain: tuple[str, ...]) -> Any:
        if name in chain:
            loop = " -> ".join((*chain[chain.index(name):], name))
            raise MacroCycle(f"macros refer to each other ({loop}) — break the loop")
        value = self._values[name]
        if isinstance(value, str):
            return self._expand_text(value, True, (*chain, name))
        return value


def _check_declaration(name: str, value: Any, key: str, log: ProblemLog) -> bool:
    if len(name) > MAX_NAME_LENGTH:
        log.error(key, f"macro name is {len(name)} characters long — keep it under 64")
        return False
    if not MACRO_NAME.fullmatch(name):
        log.error(key, "macro names may only use letters, digits, '_' and '-' — rename it")
        return False
    if name in RESERVED:
        log.error(key, f"{name} is reserved (set by llamaswap itself: {', '.join(RESERVED)}) — choose another name")
        return False
    if value is None or isinstance(value, (dict, list)):
        log.error(key, f"a macro value must be a string, number or bool, got {kind_of(value)} — e.g. `{name}: \"--ctx-size 4096\"`")
        return False
    if isinstance(value, str) and f"${{{name}}}" in value:
        log.error(key, f"refers to itself (${{{name}}}) — a macro can only use macros declared before it")
        return False
    return True


def leftover_references(text: str) -> list[str]:
    """`${...}` references still present after expansion."""
    return ANY_REF.findall(text)

