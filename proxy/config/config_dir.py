"""`--config-dir DIR`: a config split over several files, merged as llama-swap merges them.

The files are `--config` (when given) and then every other top-level `*.yml`/`*.yaml` of DIR, in
sorted filename order (a `--config` file inside DIR is read once, first). Mappings merge key by key; the ID maps (`models`, `groups`, `profiles`,
`selectors`, `peers`, `matrix`, `routing.router.settings.groups`/`.matrix`) must not define one
ID in two files; two different values for one setting are an error; a null gives way to the
other file's value. Every problem names the file it comes from.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from .errors import ConfigError, Problem, ProblemLog
from .loader import Config, check_document, read_config_text
from .secrets import is_secret
from .yaml_document import read_yaml_document

IDENTITY_MAPS = frozenset(
    {"models", "groups", "profiles", "selectors", "peers", "matrix", "routing.router.settings.groups",
     "routing.router.settings.matrix"}
)
SUFFIXES = (".yml", ".yaml")


class MergedConfigError(ConfigError):
    """A ConfigError whose problems each name the file they come from (`files`, one per problem)."""

    def __init__(self, path: str, problems: list[Problem], files: list[str], warnings: Sequence[str] = ()):
        self.files = list(files)
        super().__init__(path, problems, warnings)

    def __reduce__(self):
        return (MergedConfigError, (self.path, self.problems, self.files, self.warnings))

    def __str__(self) -> str:
        return "\n".join(problem.render(file) for problem, file in zip(self.problems, self.files, strict=True))


def config_files(path: str | os.PathLike | None, config_dir: str | os.PathLike) -> list[str]:
    """The files merged, in order: `path`, then DIR's top-level YAML files by name."""
    directory = Path(config_dir)
    if not directory.is_dir():
        raise ConfigError(str(config_dir), [Problem("", "not a directory — check the path given with --config-dir")])
    found = sorted(entry.name for entry in directory.iterdir() if entry.name.endswith(SUFFIXES) and entry.is_file())
    files = ([os.path.abspath(path)] if path else []) + [str(directory.resolve() / name) for name in found]
    if path:  # `--config` inside DIR (cfg/main.yaml with --config-dir cfg) is read once, first
        given = os.path.realpath(path)
        files = files[:1] + [file for file in files[1:] if os.path.realpath(file) != given]
    if not files:
        raise ConfigError(
            str(config_dir), [Problem("", "holds no *.yaml or *.yml file — add one with a `models:` section, or pass --config")]
        )
    return files


def sources_signature(path: str | os.PathLike | None, config_dir: str | os.PathLike | None) -> tuple:
    """What changes when a config file is edited, added or removed: polled by `--watch-config`."""
    names: list[str] = [str(path)] if path else []
    if config_dir:
        try:
            names += [str(entry) for entry in Path(config_dir).iterdir() if entry.name.endswith(SUFFIXES)]
        except OSError:
            pass
    signature = []
    for name in sorted(names):
        try:
            st = os.stat(name)
        except OSError:
            continue
        signature.append((name, st.st_mtime_ns, st.st_size, st.st_ino))
    return tuple(signature)


def load_merged(path: str | os.PathLike | None, config_dir: str | os.PathLike,
                kept_ports: Mapping[str, int] | None = None) -> Config:
    """Read `path` (optional) and DIR's files, merge them and check the result; raises ConfigError naming files."""

    files = config_files(path, config_dir)
    merger = _Merger()
    anchor_holders: dict[str, tuple[str, ...]] = {}
    for file in files:
        document = _read(file, anchor_holders)
        if document is not None:
            merger.merge(merger.data, document, "", file)
    if merger.problems:
        raise MergedConfigError(merger.label(files), [problem for problem, _ in merger.problems], [f for _, f in merger.problems])
    label = merger.label(files)
    log = ProblemLog(label)
    log.anchor_holders.update(anchor_holders)
    try:
        config = check_document(merger.data, log, kept_ports)
    except ConfigError as exc:
        raise MergedConfigError(label, exc.problems, [merger.origin_of(p.key, label) for p in exc.problems],
                                [merger.relabel_warning(warning, label) for warning in exc.warnings]) from None
    return dataclasses.replace(config, warnings=tuple(merger.relabel_warning(warning, label) for warning in config.warnings))


def _read(file: str, anchor_holders: dict[str, tuple[str, ...]]) -> dict | None:
    """One file's document (None when it holds nothing); its own problems are raised naming it. Its top-level keys
    that hold YAML anchors are added to `anchor_holders`."""

    text = read_config_text(file)
    try:
        if yaml.safe_load(text) is None:  # only comments: a fragment may be switched off that way
            return None
    except yaml.YAMLError:
        pass  # reported with its line below
    log = ProblemLog(file)
    document = read_yaml_document(text, log)
    log.raise_if_any()
    anchor_holders.update(log.anchor_holders)
    if not isinstance(document, dict):
        raise ConfigError(file, [Problem("", "the top level must be a mapping of settings — e.g. start the file with `models:`")])
    return document


class _Merger:
    def __init__(self) -> None:
        self.data: dict = {}
        self.origins: dict[str, str] = {}  # key path -> the file that set it
        self.problems: list[tuple[Problem, str]] = []

    def merge(self, into: dict, document: dict, key: str, file: str) -> None:
        for name, value in document.items():
            child = f"{key}.{name}" if key else str(name)
            if name not in into or into[name] is None:
                if value is not None or name not in into:
                    into[name] = value
                    self._set_origins(child, value, file)
                continue
            if value is None:  # a null gives way to the other file's value
                continue
            existing = into[name]
            if child in IDENTITY_MAPS and isinstance(existing, dict) and isinstance(value, dict):
                for entry, settings in value.items():
                    entry_key = f"{child}.{entry}"
                    if entry in existing and settings is None:  # a null gives way here too
                        continue
                    if entry in existing and existing[entry] is not None:
                        self.problems.append((Problem(
                            entry_key,
                            f"defined in both {self.origins.get(entry_key, '?')} and {file} — "
                            "define each ID in one file only",
                        ), file))
                    else:
                        existing[entry] = settings
                        self._set_origins(entry_key, settings, file)
            elif isinstance(existing, dict) and isinstance(value, dict):
                self.merge(existing, value, child, file)
            elif existing != value:
                if is_secret(child):  # the values are keys: where they differ is all the fix needs
                    differ = f"{self.origins.get(child, '?')} and {file} set different values"
                else:
                    differ = f"{self.origins.get(child, '?')} sets {_shown(existing)} and {file} sets {_shown(value)}"
                self.problems.append((Problem(child, f"{differ} — set it in one file only"), file))

    def _set_origins(self, key: str, value: Any, file: str) -> None:
        self.origins[key] = file
        if isinstance(value, dict):
            for name, child in value.items():
                self._set_origins(f"{key}.{name}", child, file)

    def origin_of(self, key: str, default: str) -> str:
        """The file that set `key`, or the nearest enclosing key's; `default` for what no file set (a missing key)."""
        best, length = default, -1
        for known, file in self.origins.items():
            if (key == known or key.startswith((known + ".", known + "["))) and len(known) > length:
                best, length = file, len(known)
        return best

    def relabel_warning(self, warning: str, label: str) -> str:
        rest = warning[len(label) + 2:] if warning.startswith(label + ": ") else None
        if rest is None:
            return warning
        key = rest.split(": ", 1)[0]
        return f"{self.origin_of(key, label)}: {rest}"

    @staticmethod
    def label(files: list[str]) -> str:
        return " + ".join(files)


def _shown(value: Any) -> str:
    text = yaml.safe_dump(value, default_flow_style=True, width=10_000).strip()
    text = text.removesuffix("\n...").removesuffix("...").strip()
    return text if len(text) <= 60 else text[:57] + "..."
