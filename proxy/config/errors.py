"""Config problems are collected, not raised one at a time.

Users hate fix-one-rerun loops, so every check records a `Problem` and the
loader raises a single `ConfigError` listing all of them at the end.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from scheduling.core.settings import kind_of  # noqa: F401 (the config checks' wording, shared with the admin)


@dataclass(frozen=True)
class Problem:
    """One thing wrong in the file: where (dotted key path) and what to do about it."""

    key: str
    message: str

    def render(self, path: str) -> str:
        where = f"{path}: {self.key}: " if self.key else f"{path}: "
        return where + self.message


class ConfigError(Exception):
    """The config file cannot be used; `problems` lists everything that is wrong with it, `warnings` what the checks
    found besides (rendered, as `LoadedConfig.warnings`), so `--check` shows them too."""

    def __init__(self, path: str | os.PathLike, problems: list[Problem], warnings: Sequence[str] = ()):
        if not problems:
            raise ValueError("ConfigError needs at least one problem")
        self.path = str(path)
        self.problems = list(problems)
        self.warnings = tuple(warnings)
        super().__init__(str(self))

    def __reduce__(self):
        return (ConfigError, (self.path, self.problems, self.warnings))

    @property
    def key(self) -> str:
        """Key path of the first problem ("" when it concerns the whole file)."""
        return self.problems[0].key

    @property
    def message(self) -> str:
        """Message of the first problem."""
        return self.problems[0].message

    def __str__(self) -> str:
        return "\n".join(problem.render(self.path) for problem in self.problems)


class ProblemLog:
    """Accumulates problems and warnings while a file is checked.

    A value whose `${env.NAME}` is not set is unknown: that is reported once, and later checks of the
    same key (or anything under it) say nothing, since they would only be about the placeholder text.
    """

    def __init__(self, path: str):
        self.path = path
        self.problems: list[Problem] = []
        self.warnings: list[str] = []
        self._unknown: set[str] = set()
        # Top-level keys that define YAML anchors, with the anchors' names: what such a key is for, when no
        # setting of that name exists.
        self.anchor_holders: dict[str, tuple[str, ...]] = {}

    def error(self, key: str, message: str) -> None:
        if not self.is_unknown(key):
            self.problems.append(Problem(key, message))

    def unknown_value(self, key: str, message: str | None = None) -> None:
        """The value at `key` cannot be known: say why (once, where the variable is used) and silence
        the checks that would follow from it."""
        if message is not None:
            self.problems.append(Problem(key, message))
        self._unknown.add(key)

    def is_unknown(self, key: str) -> bool:
        return any(key == unknown or key.startswith((unknown + ".", unknown + "[")) for unknown in self._unknown)

    def warn(self, key: str, message: str) -> None:
        self.warnings.append(Problem(key, message).render(self.path))

    def raise_if_any(self) -> None:
        if self.problems:
            raise ConfigError(self.path, self.problems, self.warnings)
