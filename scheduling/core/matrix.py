"""llama-swap's matrix router: the model combinations that may run together, and what a start evicts.

Each named set is an expression over model names: `&` (run together), `|` (alternatives),
parentheses and `+name` (the expression of another set). It expands to combinations, and any
subset of a combination may run. To start a model, the router keeps the combination holding it
whose evicted running models cost least (ties go to the set defined first) and stops the rest; a
model in no set runs alone. Pure, like the group router, so schedulers ask it at decision time.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

DEFAULT_EVICT_COST = 1
# A set whose expansion grows past this is almost surely a mistake (and would make every start slow).
MAX_COMBINATIONS = 4096


def is_name_char(char: str) -> bool:
    """Characters of a model name or set reference inside an expression."""
    return char.isalnum() or char in "_-."


class MatrixSyntaxError(ValueError):
    """An expression that cannot be parsed; `position` is the 1-based character where it goes wrong."""

    def __init__(self, message: str, position: int) -> None:
        super().__init__(f"{message} at character {position}")
        self.position = position


@dataclass(frozen=True)
class Name:
    """A var or model ID as written."""

    text: str


@dataclass(frozen=True)
class SetRef:
    """`+name`: the expression of another set."""

    name: str


@dataclass(frozen=True)
class AllOf:
    parts: tuple[Expression, ...]


@dataclass(frozen=True)
class AnyOf:
    parts: tuple[Expression, ...]


Expression = Name | SetRef | AllOf | AnyOf


def parse_expression(text: str) -> Expression:
    """Parse one set expression; `&` binds tighter than `|`."""
    return _Parser(text).parse()


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = list(self._tokenize(text))
        self.index = 0

    def _tokenize(self, text: str):
        """(kind, value, 1-based position) tuples; kind is one of & | ( ) name ref end."""
        position = 0
        while position < len(text):
            char = text[position]
            if char.isspace():
                position += 1
            elif char in "&|()":
                yield char, char, position + 1
                position += 1
            elif char == "+" or is_name_char(char):
                start = position + (char == "+")
                end = start
                while end < len(text) and is_name_char(text[end]):
                    end += 1
                if end == start:
                    raise MatrixSyntaxError("expected a set name after '+'", position + 1)
                yield ("ref" if char == "+" else "name"), text[start:end], position + 1
                position = end
            else:
                raise MatrixSyntaxError(
                    f"unexpected character {char!r} (names in a set use letters, digits, '_', '-' and '.'; "
                    "give a model ID with other characters a short name under vars, "
                    "which uses only letters, digits, '-' and '.')",
                    position + 1,
                )
        yield "end", "", len(text) + 1

    def parse(self) -> Expression:
        if self.tokens[0][0] == "end":
            raise MatrixSyntaxError("empty expression — write model names joined by & and |", 1)
        expression = self._any_of()
        kind, value, position = self.tokens[self.index]
        if kind != "end":
            raise MatrixSyntaxError(f"unexpected {value!r} (missing & or | before it?)", position)
        return expression

    def _any_of(self) -> Expression:
        parts = [self._all_of()]
        while self.tokens[self.index][0] == "|":
            self.index += 1
            parts.append(self._all_of())
        return parts[0] if len(parts) == 1 else AnyOf(tuple(parts))

    def _all_of(self) -> Expression:
        parts = [self._atom()]
        while self.tokens[self.index][0] == "&":
            self.index += 1
            parts.append(self._atom())
        return parts[0] if len(parts) == 1 else AllOf(tuple(parts))

    def _atom(self) -> Expression:
        kind, value, position = self.tokens[self.index]
        self.index += 1
        if kind == "name":
            return Name(value)
        if kind == "ref":
            return SetRef(value)
        if kind == "(":
            inner = self._any_of()
            closing, found, at = self.tokens[self.index]
            if closing != ")":
                what = "the end" if closing == "end" else repr(found)
                raise MatrixSyntaxError(f"missing ')' for the '(' at character {position}, found {what}", at)
            self.index += 1
            return inner
        what = "the end of the expression" if kind == "end" else repr(value)
        raise MatrixSyntaxError(f"expected a model name, '+set' or '(' but found {what}", position)


@dataclass(frozen=True)
class MatrixSet:
    """One named set, expanded: the combinations of model IDs it allows, in expansion order."""

    name: str
    combinations: tuple[frozenset[str], ...]


def compile_sets(
    definitions: Mapping[str, str], resolve: Callable[[str], str | None]
) -> tuple[tuple[MatrixSet, ...], dict[str, list[str]]]:
    """Expand every set (in definition order) with names mapped to model IDs by `resolve`.

    Returns the sets that expanded and, per set name, what is wrong with the others; a set that
    only fails because a set it references is broken gets no message of its own.
    """
    problems: dict[str, list[str]] = {}
    parsed: dict[str, Expression] = {}
    for name, text in definitions.items():
        try:
            parsed[name] = parse_expression(text)
        except MatrixSyntaxError as exc:
            problems.setdefault(name, []).append(str(exc))
            continue
        for unknown in _unresolved_names(parsed[name], resolve):
            problems.setdefault(name, []).append(
                f'"{unknown}" is neither a var nor a model ID — add it under vars or fix the spelling'
            )
        for ref in _references(parsed[name]):
            if ref not in definitions:
                known = ", ".join(definitions) or "none"
                problems.setdefault(name, []).append(f'"+{ref}" names no set — defined sets: {known}')
    for cycle in _cycles(parsed):
        problems.setdefault(cycle[0], []).append(
            "sets refer to each other in a circle ("
            + " → ".join(f"+{name}" for name in cycle + [cycle[0]])
            + ") — break the circle by writing one of them out"
        )

    expanded: dict[str, tuple[frozenset[str], ...] | None] = {}

    def expand(name: str, trail: tuple[str, ...]) -> tuple[frozenset[str], ...] | None:
        if name in expanded:
            return expanded[name]
        if name in problems or name not in parsed or name in trail:
            return None
        try:
            result = _expand(parsed[name], resolve, lambda ref: expand(ref, trail + (name,)))
        except _TooMany:
            problems.setdefault(name, []).append(
                f"expands to more than {MAX_COMBINATIONS} combinations — split it into smaller sets"
            )
            result = None
        expanded[name] = result
        return result

    sets = []
    for name in definitions:
        combinations = expand(name, ())
        if combinations is not None:
            sets.append(MatrixSet(name, combinations))
    return tuple(sets), problems


def _walk(expression: Expression):
    yield expression
    if isinstance(expression, (AllOf, AnyOf)):
        for part in expression.parts:
            yield from _walk(part)


def _unresolved_names(expression: Expression, resolve: Callable[[str], str | None]) -> list[str]:
    names = [node.text for node in _walk(expression) if isinstance(node, Name) and resolve(node.text) is None]
    return list(dict.fromkeys(names))


def _references(expression: Expression) -> list[str]:
    return list(dict.fromkeys(node.name for node in _walk(expression) if isinstance(node, SetRef)))


def _cycles(parsed: Mapping[str, Expression]) -> list[list[str]]:
    """Each reference circle once, as the list of set names in it, starting at the first defined."""
    order = {name: position for position, name in enumerate(parsed)}
    edges = {name: [ref for ref in _references(expression) if ref in parsed] for name, expression in parsed.items()}
    found: list[list[str]] = []
    seen: set[frozenset[str]] = set()
    done: set[str] = set()

    def visit(name: str, path: list[str]) -> None:
        if name in path:
            cycle = path[path.index(name):]
            start = min(range(len(cycle)), key=lambda i: order[cycle[i]])
            cycle = cycle[start:] + cycle[:start]
            if frozenset(cycle) not in seen:
                seen.add(frozenset(cycle))
                found.append(cycle)
            return
        if name in done:
            return
        for ref in edges[name]:
            visit(ref, path + [name])
        done.add(name)

    for name in parsed:
        visit(name, [])
    return found


class _TooMany(Exception):
    """An expansion past MAX_COMBINATIONS."""


def _expand(expression: Expression, resolve, expand_ref) -> tuple[frozenset[str], ...] | None:
    """The combinations of `expression` in order, without repeats; None when a reference is broken."""
    if isinstance(expression, Name):
        return (frozenset({resolve(expression.text)}),)
    if isinstance(expression, SetRef):
        return expand_ref(expression.name)
    parts = []
    for part in expression.parts:
        combinations = _expand(part, resolve, expand_ref)
        if combinations is None:
            return None
        parts.append(combinations)
    if isinstance(expression, AnyOf):
        result = tuple(dict.fromkeys(itertools.chain.from_iterable(parts)))
    else:
        result = (frozenset(),)
        for combinations in parts:
            if len(result) * len(combinations) > MAX_COMBINATIONS * 4:
                raise _TooMany
            result = tuple(dict.fromkeys(left | right for left in result for right in combinations))
    if len(result) > MAX_COMBINATIONS:
        raise _TooMany
    return result


@dataclass(frozen=True)
class MatrixChoice:
    """What starting a model means: the set chosen (None when the model is in no set or already
    runs), the running models to stop, and what stopping them costs."""

    set_name: str | None
    evict: frozenset[str]
    cost: int


class MatrixPolicy:
    """The eviction rules of a matrix; the same `evictions` question as the group router's."""

    def __init__(self, sets: Iterable[MatrixSet], evict_costs: Mapping[str, int] | None = None) -> None:
        self.sets = tuple(sets)
        self._costs = dict(evict_costs or {})
        for model, cost in self._costs.items():
            if isinstance(cost, bool) or not isinstance(cost, int) or cost < 1:
                raise ValueError(f"evict cost of {model!r} must be a whole number ≥ 1, got {cost!r}")
        names = [matrix_set.name for matrix_set in self.sets]
        if len(set(names)) != len(names):
            raise ValueError("matrix set names must be unique")
        # model → (set name, combination) in definition and expansion order: a start only
        # looks at the combinations that hold its model.
        self._holding: dict[str, list[tuple[str, frozenset[str]]]] = {}
        for matrix_set in self.sets:
            for combination in matrix_set.combinations:
                for model in combination:
                    self._holding.setdefault(model, []).append((matrix_set.name, combination))

    def evict_cost(self, model: str) -> int:
        return self._costs.get(model, DEFAULT_EVICT_COST)

    def choose(self, target: str, running: Iterable[str]) -> MatrixChoice:
        """The cheapest combination holding `target`: the first defined one among equals."""
        running = frozenset(running)
        if target in running:
            return MatrixChoice(None, frozenset(), 0)
        best: MatrixChoice | None = None
        for set_name, combination in self._holding.get(target, ()):
            evict = running - combination
            cost = sum(self.evict_cost(model) for model in evict)
            if best is None or cost < best.cost:
                best = MatrixChoice(set_name, evict, cost)
                if cost == 0:
                    break
        if best is None:
            return MatrixChoice(None, running, sum(self.evict_cost(model) for model in running))
        return best

    def evictions(self, target: str, running: Iterable[str]) -> frozenset[str]:
        """Models of `running` that must stop before `target` starts (never `target` itself)."""
        return self.choose(target, running).evict
