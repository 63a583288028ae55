"""Forms of the operators' admin pages: their fields checked as the config file checks its values."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Mapping

from django import forms

from scheduling.core import PRIORITY_ALIASES, parse_priority
from scheduling.core.settings import slot_count_problem
from scheduling.door import frontdoor
from scheduling.models import SchedulerSettings
from scheduling.operating.settings_store import ignored_slots
from scheduling.whole_numbers import whole_number

_SIGNED_INTEGER = re.compile(r"[+-]?[0-9]+")
_DECIMAL = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")
_SLOTS_EXAMPLE = "one `model: N` per line, e.g. chat: 4"
_INT64_MAX = 2**63 - 1


class PriorityField(forms.CharField):
    """A request priority as the header takes it (a signed integer or an alias), but strict.

    The header quietly reads anything unknown as 0; an operator who mistypes
    should be told instead.
    """

    def to_python(self, value) -> int | None:
        text = super().to_python(value).strip()
        if not text:
            return None
        magnitude = whole_number(text.lstrip("+-"), _INT64_MAX + 1) if _SIGNED_INTEGER.fullmatch(text) else None
        if text.lower() in PRIORITY_ALIASES or (
            magnitude is not None and (magnitude <= _INT64_MAX or text.startswith("-"))
        ):
            return parse_priority(text)
        aliases = ", ".join(f"{name} ({number})" for name, number in PRIORITY_ALIASES.items())
        raise forms.ValidationError(
            f"'{text}' is not a priority; enter a whole number such as 100 or -98, or one of {aliases}"
        )


class PriorityForm(forms.Form):
    priority = PriorityField(
        label="New priority",
        help_text=(
            "Higher goes first: interactive = 100, normal = 0, batch = -100. "
            "The request keeps its arrival time, so its aging carries on."
        ),
    )


class SlotsField(forms.CharField):
    """`slots` as an operator types it: one `model: N` per line, or a JSON object; blank: not overridden.

    Only the shape is read here (a count reads as the config file would read it: 2 a whole
    number, 2.0 a decimal, two text); whether the names are models and the counts whole
    numbers ≥ 1 is checked against the config by the form, with the config file's messages.
    """

    widget = forms.Textarea(attrs={"rows": 4, "cols": 40})

    def to_python(self, value) -> dict[str, object] | None:
        text = super().to_python(value).strip()
        if not text:
            return None
        if text.startswith("{"):
            return self._from_json(text)
        slots: dict[str, object] = {}
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            name, colon, count = (part.strip() for part in line.partition(":"))
            if not colon or not name or not count:
                raise forms.ValidationError(f"line {number} ({line.strip()!r}) is not `model: N` — write {_SLOTS_EXAMPLE}")
            if name in slots:
                raise forms.ValidationError(f"{name!r} is listed twice — keep one line per model")
            slots[name] = _typed(count)
        return slots

    @staticmethod
    def _from_json(text: str) -> dict[str, object]:
        try:
            parsed = json.loads(text, object_pairs_hook=_refuse_repeated_keys)
        except _RepeatedKey as exc:
            raise forms.ValidationError(
                f"{str(exc)!r} is listed twice — JSON would keep only the last one; keep one entry per model"
            ) from None
        except ValueError as exc:
            raise forms.ValidationError(f"not valid JSON ({exc}) — write {_SLOTS_EXAMPLE}, or a JSON object") from None
        except RecursionError:
            raise forms.ValidationError(f"not valid JSON (nested too deeply) — write {_SLOTS_EXAMPLE}") from None
        if not isinstance(parsed, dict):
            raise forms.ValidationError(f"not a JSON object — write {_SLOTS_EXAMPLE}")
        return parsed

    def prepare_value(self, value):
        if isinstance(value, Mapping):
            return "\n".join(f"{model}: {count}" for model, count in value.items())
        return value


def _typed(count: str) -> int | float | str:
    """A count as typed: a whole number, a decimal, or text (which the form then refuses)."""
    digits = count.lstrip("+-").lstrip("0") or "0"
    if _SIGNED_INTEGER.fullmatch(count) and len(digits) <= sys.get_int_max_str_digits():  # else int() refuses it
        return -int(digits) if count.startswith("-") else int(digits)
    return float(count) if _DECIMAL.fullmatch(count) else count


class _RepeatedKey(ValueError):
    pass


def _refuse_repeated_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    """json.loads keeps the last of repeated keys without a word; an operator should hear of it."""
    table: dict[str, object] = {}
    for key, value in pairs:
        if key in table:
            raise _RepeatedKey(key)
        table[key] = value
    return table


def config_or_problem():
    """(config, None) or (None, why there is no config to show)."""
    try:
        return frontdoor.current_config(), None
    except frontdoor.ConfigUnavailable as exc:
        return None, str(exc)


class SchedulerSettingsForm(forms.ModelForm):
    slots = SlotsField(
        label="slots",
        required=False,
        help_text=(
            "Requests each model's server takes at once (llama-server -np N): one `model: N` per line, "
            "by model ID or alias; a model not listed has 1. Blank: the config file value."
        ),
    )

    class Meta:
        model = SchedulerSettings
        fields = ("aging_divisor", "swap_affinity_bonus", "slots", "fairness")
        labels = SchedulerSettings.CONFIG_NAMES  # the config file's spelling, not capitalised

    def clean_slots(self) -> dict[str, object] | None:
        """The config file's checks, with its messages: whole numbers ≥ 1, configured models (aliases
        become model IDs), one entry per model. An entry already stored for a model the config no
        longer has may stay as it is (it is ignored until that model is configured again), so it
        never blocks an edit of the other settings."""
        slots = self.cleaned_data["slots"]
        if slots is None:
            return None
        config, _ = config_or_problem()
        stored = self.instance.slots if isinstance(self.instance.slots, Mapping) else {}  # SQL may have stored a list
        stale = ignored_slots(stored, config.models) if config is not None else {}
        resolved: dict[str, object] = {}
        set_by: dict[str, str] = {}
        for name, count in slots.items():
            problem = slot_count_problem(name, count)
            if problem is not None:
                raise forms.ValidationError(f"{name}: {problem}")
            if config is None:  # nothing to check the names against
                resolved[name] = count
                continue
            model = name if name in config.models else config.aliases.get(name)
            if model is None and name in stale and stored[name] == count:
                model = name
            elif model is None:
                known = ", ".join(sorted(config.models)) or "none"
                raise forms.ValidationError(
                    f'no model or alias is called "{name}" — use a model ID or alias from `models:` '
                    f"(defined models: {known})"
                )
            if model in set_by:
                raise forms.ValidationError(
                    f'"{name}" is model {model}, whose slots are already set by "{set_by[model]}" — keep one entry'
                )
            set_by[model] = name
            resolved[model] = count
        return resolved
