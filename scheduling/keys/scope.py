"""What a key allows: its models, its kind (operator, read-only), the priority its requests get and its quotas.

Pure: the HTTP side asks these questions of a key it has identified; the rows are `scheduling.keys.store`'s.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fnmatch import fnmatchcase

from scheduling.core import mentions
from scheduling.keys.quota import UNLIMITED, QuotaLimits


@dataclass(frozen=True)
class KeyScope:
    """A key's rights. `models` are globs (`fnmatch`, case-sensitive) over model IDs; none: every model."""

    name: str = ""  # the row's name; "" for a config file apiKey or an open server
    models: tuple[str, ...] = ()
    operator: bool = False
    read_only: bool = False
    max_priority: int | None = None
    default_priority: int | None = None
    limits: QuotaLimits = UNLIMITED
    weight: int = 1  # its share of turns among keys with fairness: keys (`scheduling.core.fairness`)

    def allows_model(self, model: str) -> bool:
        return not self.models or any(fnmatchcase(model, glob) for glob in self.models)

    def sees_model(self, model: str) -> bool:
        """Whether the key is shown `model`'s state (loaded, queue, placement, series): an operator key every
        model's, another key its own models' only."""
        return self.operator or self.allows_model(model)

    def sees_key(self, key: str) -> bool:
        """Whether the key may see another key's name in a text: an operator sees every key's, another its own."""
        return self.operator or key == self.name

    def told(self, text: str) -> str:
        """A text about one of the key's requests, as the key is told it: each model it may not see mentioned as
        "another model", with no lease id or eviction cost of it, each other key as "another key"
        (`scheduling.core.mentions`)."""
        return mentions.told(text, self.sees_model, self.sees_key)

    def owner_filter(self) -> str | None:
        """Whose files, batches and requests this key may see (and files and batches change): its own (made or
        sent under its name), or everyone's (None) for an operator key, a config file's key and an open server."""
        return None if self.operator else self.name

    def applied_priority(self, asked: int | None) -> int:
        """The priority a request gets: what it asked for (None: no header, so the key's default, else 0),
        at most the key's maximum."""
        priority = (self.default_priority or 0) if asked is None else asked
        return priority if self.max_priority is None else min(priority, self.max_priority)


# A config file apiKey, and every caller of a server without keys: everything, as before keys had scopes.
UNRESTRICTED = KeyScope(operator=True)


# The `key` label values of /metrics that stand for no key row: a config file apiKey, an open server, names past
# the label limit (scheduling.metrics.KeyLabels). No key row may take one, or its series would pass for theirs.
CONFIG_LABEL, OPEN_LABEL, OVERFLOW_LABEL = "config", "none", "other"
NO_ROW_LABELS = (CONFIG_LABEL, OPEN_LABEL, OVERFLOW_LABEL)

# A glob: a bracket set ([3,4] may hold a comma or a space) or any character but a separator, as often as written.
_GLOB = re.compile(r"(?:\[[^\]\n]+\]|[^\s,])+")


def globs_from_text(text: str) -> tuple[str, ...]:
    """Globs written one per line, or separated by commas or spaces (the admin's text box); a bracket set is
    part of its glob, separators inside it included."""
    return tuple(_GLOB.findall(text))
