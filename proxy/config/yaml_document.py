"""Turn the config text into plain Python data, with `${env.NAME}` filled in.

Environment macros are the first phase of macro expansion. They are replaced
inside the YAML scalars (keys and values) before the document is built, so
occurrences in YAML comments are ignored, and an unquoted value that is
exactly `${env.NAME}` takes the type its text has (`8080` becomes an int),
as if the text had been pasted into the file. Unlike pasting text, a value
can never change the structure of the document.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

import yaml

from .errors import ProblemLog

ENV_MACRO = re.compile(r"\$\{env\.([A-Za-z_][A-Za-z0-9_]*)\}")
_MERGE_KEY = "tag:yaml.org,2002:merge"


class _ConfigLoader(yaml.SafeLoader):
    """PyYAML's safe loader, reading `1e3` as a number as YAML 1.2 (and llama-swap's Go parser) does: YAML 1.1
    wants a sign in the exponent and a dot in the mantissa, so PyYAML alone reads it as text. It also notes each
    node's anchor, which PyYAML forgets once the document is composed."""

    def __init__(self, stream) -> None:
        super().__init__(stream)
        self.anchored: dict[int, str] = {}  # id(node) -> the name of the anchor it carries

    def compose_node(self, parent, index):
        event = self.peek_event()
        node = super().compose_node(parent, index)
        if not isinstance(event, yaml.AliasEvent) and event.anchor is not None:
            self.anchored[id(node)] = event.anchor
        return node


_ConfigLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


def read_yaml_document(text: str, log: ProblemLog, environ: Mapping[str, str] | None = None) -> Any:
    """Parse `text`; returns None (with problems logged) when it cannot be used."""
    environ = os.environ if environ is None else environ
    loader = _ConfigLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            log.error("", "the file is empty — it needs at least a `models:` section")
            return None
        _EnvFiller(environ, log, loader).visit(node, "")
        log.anchor_holders.update(_anchor_holders(node, loader.anchored))
        return loader.construct_document(node)
    except yaml.MarkedYAMLError as exc:
        log.error("", _describe_syntax_error(exc))
        return None
    except yaml.YAMLError as exc:
        log.error("", f"not valid YAML: {exc} — fix the syntax")
        return None
    finally:
        loader.dispose()


def _anchor_holders(document: yaml.Node, anchored: dict[int, str]) -> dict[str, tuple[str, ...]]:
    """The top-level keys whose value defines YAML anchors, with the anchors' names: llama-swap configs keep
    shared settings under a key of their own (`defaults: &d …`) and merge them into models (`<<: *d`)."""
    holders = {}
    if isinstance(document, yaml.MappingNode):
        for key_node, value_node in document.value:
            within = range(key_node.end_mark.index, value_node.end_mark.index + 1)
            names, pending, seen = [], [value_node], set()
            while pending:
                node = pending.pop()
                if id(node) in seen or node.start_mark.index not in within:  # an alias of an anchor set elsewhere
                    continue
                seen.add(id(node))
                if id(node) in anchored:
                    names.append(anchored[id(node)])
                if isinstance(node, yaml.SequenceNode):
                    pending += reversed(node.value)
                elif isinstance(node, yaml.MappingNode):
                    pending += reversed([part for pair in node.value for part in pair])
            if names and isinstance(key_node, yaml.ScalarNode):
                holders[str(key_node.value)] = tuple(names)
    return holders


def _describe_syntax_error(exc: yaml.MarkedYAMLError) -> str:
    mark = exc.problem_mark or exc.context_mark
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
    what = exc.problem or "invalid syntax"
    if exc.context:
        what = f"{what} ({exc.context})"
    hint = "check the indentation and quoting there"
    if "'\\t'" in what:
        hint = "indent with spaces, not tabs"
    return f"{where}YAML syntax error: {what} — {hint}"


def _child_key(parent: str, name: str) -> str:
    return f"{parent}.{name}" if parent else name


class _EnvFiller:
    """Walks the node tree: fills env macros in scalars and reports duplicate keys."""

    def __init__(self, environ: Mapping[str, str], log: ProblemLog, loader: _ConfigLoader):
        self.environ = environ
        self.log = log
        self.loader = loader
        self.seen: set[int] = set()

    def visit(self, node: yaml.Node, key: str) -> None:
        if id(node) in self.seen:  # anchors make shared nodes; fill each once
            return
        self.seen.add(id(node))
        if isinstance(node, yaml.ScalarNode):
            self._fill(node, key)
        elif isinstance(node, yaml.SequenceNode):
            for index, item in enumerate(node.value):
                self.visit(item, f"{key}[{index}]")
        elif isinstance(node, yaml.MappingNode):
            self._visit_mapping(node, key)

    def _visit_mapping(self, node: yaml.MappingNode, key: str) -> None:
        first_line: dict[str, int] = {}
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE_KEY:
                self.visit(value_node, key)
                continue
            self.visit(key_node, key)
            name = str(key_node.value) if isinstance(key_node, yaml.ScalarNode) else "?"
            line = key_node.start_mark.line + 1
            if name in first_line:
                self.log.error(
                    _child_key(key, name),
                    f"defined twice (lines {first_line[name]} and {line}) — "
                    "YAML keeps only the last one; remove or rename one of them",
                )
            else:
                first_line[name] = line
            self.visit(value_node, _child_key(key, name))

    def _fill(self, node: yaml.ScalarNode, key: str) -> None:
        if "${env." not in node.value:
            return
        line = node.start_mark.line + 1

        def replace(match: re.Match) -> str:
            name = match.group(1)
            value = self.environ.get(name)
            if value is None:
                self.log.unknown_value(
                    key,
                    f"${{env.{name}}} (line {line}) is not set in the environment — "
                    f"export {name} before starting llamaswap, or remove the reference",
                )
                return match.group(0)
            if any(char in value for char in "\n\r\0"):
                self.log.unknown_value(
                    key,
                    f"${{env.{name}}} (line {line}) contains a newline or NUL byte, which a config "
                    f"value cannot hold — put a single-line value in {name}",
                )
                return match.group(0)
            return value

        was_implicit = node.tag == self.loader.resolve(yaml.ScalarNode, node.value, (True, False))
        node.value = ENV_MACRO.sub(replace, node.value)
        if node.style is None and was_implicit:
            node.tag = self.loader.resolve(yaml.ScalarNode, node.value, (True, False))
