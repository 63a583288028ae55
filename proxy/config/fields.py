"""Typed, macro-aware reading of one mapping of the config file.

Each reader checks one key, records a problem (with its full key path and a
fix) when the value is wrong and returns the default, so a single pass finds
every mistake. Keys no reader asked for are turned into warnings at the end,
which is how unknown keys, and llama-swap keys llamaswap ignores, get reported by name.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Collection
from typing import Any

from .errors import ProblemLog, kind_of
from .macros import MacroCycle, MacroScope, leftover_references
from .secrets import described, is_secret, placeholder
from .yaml_document import ENV_MACRO

MISSING: Any = object()
# The largest whole number a key takes unless it sets its own bound: JSON clients read it exactly, and it
# fits the database's 64-bit columns and the messages a worker exchanges with front ends.
MAX_WHOLE_NUMBER = 2**53 - 1
# How alike (difflib's ratio) an unknown key and a known one must be for "did you mean": 0.75 keeps dropped or
# swapped letters (logLevl, ttL, proxi) and leaves out words that only share letters (host and hooks: 0.67).
SPELLING_CUTOFF = 0.75


class Section:
    """A mapping of the file at key path `key`, read through a macro scope."""

    def __init__(
        self,
        data: dict,
        key: str,
        log: ProblemLog,
        scope: MacroScope | None = None,
        *,
        model_id: str | None = None,
    ):
        self.data = data
        self.key = key
        self.log = log
        self.scope = scope
        self.model_id = model_id
        self._read: set[str] = set()

    # -- plumbing ---------------------------------------------------------

    def path(self, name: str) -> str:
        return f"{self.key}.{name}" if self.key else name

    def error(self, name: str, message: str) -> None:
        self.log.error(self.path(name), message)

    def has(self, name: str) -> bool:
        return name in self.data

    def raw(self, name: str, default: Any = MISSING) -> Any:
        """The value as written (macros not expanded), or `default` when the key is absent."""
        self._read.add(name)
        return self.data.get(name, default)

    def expanded(self, name: str, *, typed: bool = True, allow_refs: Collection[str] = ()) -> Any:
        """The value with macros expanded and leftover references reported, or MISSING."""
        value = self.raw(name)
        if value is MISSING or value is None:
            return value
        if self.scope is not None:
            try:
                value = self.scope.expand(value, typed=typed)
            except MacroCycle as exc:
                self.error(name, str(exc))
                return MISSING
        if not self._report_leftovers(self.path(name), value, allow_refs):
            return MISSING
        return value

    def expanded_key(self, name: str, key: Any) -> str | None:
        """`key`, a key of the mapping at `name`, with macros expanded (None when one is left unresolved).

        Mapping keys are taken as written everywhere else; setParamsByID's keys are request names
        such as `${MODEL_ID}:high`, which llama-swap expands.
        """
        text = str(key)
        if self.scope is not None:
            try:
                text = self.scope.expand(text, typed=False)
            except MacroCycle as exc:
                self.error(f"{name}.{key}", str(exc))
                return None
        if not self._report_leftovers(f"{self.path(name)}.{key}", text, ()):
            return None
        return text

    def _report_leftovers(self, key: str, value: Any, allow_refs: Collection[str]) -> bool:
        if isinstance(value, str):
            bad = [ref for ref in leftover_references(value) if ref not in allow_refs]
            for ref in dict.fromkeys(bad):
                if ENV_MACRO.fullmatch(ref):
                    # An unset variable, reported where it is used; it reached here through a macro.
                    self.log.unknown_value(key)
                else:
                    self.log.error(key, self._leftover_message(ref, key))
            return not bad
        if isinstance(value, dict):
            results = [self._report_leftovers(f"{key}.{k}", v, allow_refs) for k, v in value.items()]
            return all(results)
        if isinstance(value, list):
            results = [self._report_leftovers(f"{key}[{i}]", v, allow_refs) for i, v in enumerate(value)]
            return all(results)
        return True

    def _leftover_message(self, ref: str, key: str) -> str:
        name = ref[2:-1]
        if name == "PID":
            return "${PID} is only known in cmdStop (it is the process id at stop time) — remove it here"
        if name == "GPUS":
            if self.model_id is not None and key.rpartition(".")[2] in ("cmd", "cmdStop"):
                return (
                    "${GPUS} stands for the GPUs the model starts on, which need a top-level `hardware:` section, "
                    "and this config has none — describe the GPUs (hardware: {gpus: [{id: 0, memory: 24GiB}]}), "
                    "or remove ${GPUS}"
                )
            return "${GPUS} is only filled in a model's cmd and cmdStop — remove it here"
        if name in ("PORT", "MODEL_ID") and self.model_id is None:
            return f"{ref} only exists inside a model — it cannot be used outside `models:`"
        if name == "PORT":
            return (
                "${PORT} is only assigned to models whose cmd uses ${PORT} — "
                "add `--port ${PORT}` to cmd, or write the port number"
            )
        if name.startswith("env."):
            return f"{ref} is not a valid environment variable reference — names use letters, digits and '_'"
        where = "under `macros:`"
        if self.model_id is not None:
            where += f" or models.{self.model_id}.macros"
        return f"{ref} is not a defined macro — declare {name} {where}, or fix the spelling"

    # -- typed readers ----------------------------------------------------

    def text(self, name: str, default: str = "", *, allow_refs: Collection[str] = ()) -> str:
        value = self.expanded(name, typed=False, allow_refs=allow_refs)
        if value is MISSING or value is None:
            return default
        if not isinstance(value, str):
            quoted = placeholder(self.path(name)) if is_secret(self.path(name)) else value
            self.error(name, f"expected text, got {described(self.path(name), value)} — quote it: {name}: \"{quoted}\"")
            return default
        return value

    def number(
        self,
        name: str,
        default: float,
        *,
        minimum: float | None = None,
        maximum: float | None = None,
        example: str = "60",
    ) -> float:
        """A finite number: YAML's .inf and .nan are refused, since every use of a number is a
        quantity (seconds, megabytes) that NaN or infinity would break at run time."""
        value = self.expanded(name)
        if value is MISSING or value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self.error(name, f"expected a number, got {kind_of(value)} — e.g. {name}: {example}")
            return default
        if not math.isfinite(value):
            self.error(name, f"{value} must be a finite number — e.g. {name}: {example}")
            return default
        if minimum is not None and value < minimum:
            self.error(name, f"{value} is below the minimum of {minimum:g} — e.g. {name}: {example}")
            return default
        if maximum is not None and value > maximum:
            self.error(name, f"{value} is above the maximum of {maximum:g} — e.g. {name}: {example}")
            return default
        return float(value)

    def integer(
        self,
        name: str,
        default: int,
        *,
        minimum: int | None = None,
        maximum: int | None = None,
        example: str = "10",
    ) -> int:
        value = self.expanded(name)
        if value is MISSING or value is None:
            return default
        return self.check_integer(self.path(name), value, default, minimum=minimum, maximum=maximum, example=f"{name}: {example}")

    def check_integer(
        self,
        key: str,
        value: Any,
        default: int,
        *,
        minimum: int | None = None,
        maximum: int | None = None,
        example: str,
    ) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            self.log.error(key, f"expected a whole number, got {kind_of(value)} — e.g. {example}")
            return default
        if minimum is not None and value < minimum:
            self.log.error(key, f"{value} is below the minimum of {minimum} — e.g. {example}")
            return default
        maximum = MAX_WHOLE_NUMBER if maximum is None else maximum
        if value > maximum:
            self.log.error(key, f"{value} is above the maximum of {maximum} — e.g. {example}")
            return default
        return value

    def model_integers(
        self,
        resolve: Callable[[str], str | None],
        unknown: Callable[[str], str],
        what: str,  # "slots are", "priority is": it reads "whose <what> already set by"
        *,
        default: int | None,
        minimum: int | None = None,
        maximum: int | None = None,
        example: Callable[[str], str],
    ) -> dict[str, int]:
        """A `{<model id or alias>: whole number}` table (slots, fifo priorities, matrix evict costs).

        Each entry is checked under its own key path and keyed by the model id `resolve` gives; a
        model named twice (by id and alias, say) is reported once. An invalid value counts as
        `default`, and a default of None leaves the entry out.
        """
        values: dict[str, int] = {}
        set_by: dict[str, str] = {}
        for raw_name in list(self.data):
            name = str(raw_name)
            key = self.path(name)
            value = self.expanded(raw_name)
            if value is MISSING:
                continue
            value = self.check_integer(key, value, default, minimum=minimum, maximum=maximum, example=example(name))
            real = resolve(name)
            if real is None:
                self.log.error(key, unknown(name))
            elif real in set_by:
                self.log.error(key, f'"{name}" is model {real}, whose {what} already set by "{set_by[real]}" — keep one entry')
            else:
                set_by[real] = name
                if value is not None:
                    values[real] = value
        return values

    def boolean(self, name: str, default: bool) -> bool:
        value = self.expanded(name)
        if value is MISSING or value is None:
            return default
        if not isinstance(value, bool):
            self.error(name, f"expected true or false, got {kind_of(value)}")
            return default
        return value

    def text_list(self, name: str, *, example: str) -> tuple[str, ...]:
        value = self.expanded(name, typed=False)
        if value is MISSING or value is None:
            return ()
        if not isinstance(value, list):
            self.error(name, f"expected a list, got {described(self.path(name), value)} — e.g. {name}: [{example}]")
            return ()
        items = []
        for index, item in enumerate(value):
            if not isinstance(item, str):
                key = f"{self.path(name)}[{index}]"
                quoted = placeholder(key) if is_secret(key) else item
                self.log.error(key, f"expected text, got {described(key, item)} — quote it: \"{quoted}\"")
                continue
            items.append(item)
        return tuple(items)

    def section(self, name: str) -> Section | None:
        """The nested mapping at `name` as a Section (None when absent or wrong)."""
        value = self.raw(name)
        if value is MISSING or value is None:
            return None
        if not isinstance(value, dict):
            self.error(name, f"expected a mapping of key: value, got {kind_of(value)}")
            return None
        return Section(
            value,
            self.path(name),
            self.log,
            self.scope,
            model_id=self.model_id,
        )

    # -- leftovers ------------------------------------------------------------

    def warn_unread(self, notes: dict[str, str] | None = None, meant: dict[str, str] | None = None) -> None:
        """Warn about every key nobody read: `notes` says why a known llama-swap key is ignored, `meant` (by the
        name in lower case) what a name other tools use is called here; a top-level key that defines YAML anchors
        is said to be there for them."""
        notes, meant = notes or {}, meant or {}
        for name in self.data:
            name_text = str(name)
            if name in self._read:
                continue
            if name_text in notes:
                self.log.warn(self.path(name_text), notes[name_text])
            elif not self.key and name_text in self.log.anchor_holders:
                anchors = ", ".join(f"&{anchor}" for anchor in self.log.anchor_holders[name_text])
                self.log.warn(name_text, f"not a setting: it holds the YAML anchors {anchors} that other entries "
                                         "use, and is otherwise ignored, as llama-swap ignores it")
            else:
                hint = meant.get(name_text.lower()) or self._spelling_hint(name_text)
                self.log.warn(self.path(name_text), f"unknown key, ignored — {hint}")

    def _spelling_hint(self, name: str) -> str:
        """The key read here that `name` is a misspelling of (letter case aside), if one is close enough: a looser
        match points at keys of another meaning (host → hooks, readyTimeout → unloadTimeout)."""
        known = {key.lower(): key for key in self._read}
        close = difflib.get_close_matches(name.lower(), sorted(known), n=1, cutoff=SPELLING_CUTOFF)
        return f"did you mean {known[close[0]]}?" if close else "check the spelling"
