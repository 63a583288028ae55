"""Forms of the operators' admin pages that are not plain model forms."""

from __future__ import annotations

import re

from django import forms

from scheduling.core import PRIORITY_ALIASES, parse_priority

_SIGNED_INTEGER = re.compile(r"[+-]?[0-9]+")
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
        if text.lower() in PRIORITY_ALIASES or (
            _SIGNED_INTEGER.fullmatch(text) and -_INT64_MAX - 1 <= int(text) <= _INT64_MAX
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
