"""The package's architecture rules, each a test that also tests its own scanner.

Layers point one way: `proxy` (HTTP, model processes, config) may use `scheduling`, never the reverse,
so the scheduler can run in a process that serves no HTTP at all; the engine is built by the composition
root alone; the config reader stands alone; inside `proxy` the rooms stand in one order, each importing only
those below it; and no module imports itself round a circle."""

import ast
from pathlib import Path

import pytest

from tests.core.test_purity import imported_modules

SCHEDULING = Path(__file__).resolve().parents[1] / "scheduling"
MODULES = sorted(p for p in SCHEDULING.rglob("*.py") if "migrations" not in p.parts)


def package_of(path: Path) -> str:
    """The dotted package a module's relative imports resolve against."""
    return ".".join(path.relative_to(SCHEDULING.parent).with_suffix("").parts[:-1])


def reaches_into_proxy(source: str, package: str) -> list[str]:
    return [name for name in imported_modules(source, package) if name == "proxy" or name.startswith("proxy.")]


def test_there_are_scheduling_modules_to_scan():
    assert {p.name for p in MODULES} >= {"engine.py", "site.py", "metrics.py", "frontdoor.py", "serial.py"}


@pytest.mark.parametrize("module", MODULES, ids=lambda p: str(p.relative_to(SCHEDULING)))
def test_scheduling_never_imports_proxy(module):
    assert reaches_into_proxy(module.read_text(), package_of(module)) == []


@pytest.mark.parametrize(
    "source",
    ["import proxy", "from proxy.service import current_service", "from proxy import views",
     "def f():\n    from proxy.config import ConfigError\n"],
)
def test_the_scan_sees_every_way_of_importing_proxy(source):
    assert reaches_into_proxy(source, "scheduling")


@pytest.mark.parametrize("source", ["from scheduling.core import Ticket", "from . import frontdoor", "import proxyish"])
def test_the_scan_lets_other_imports_be(source):
    assert reaches_into_proxy(source, "scheduling") == []


# The engine (`scheduling.runtime`) is built by the composition root alone (proxy/service.py); everything else
# on the HTTP side, the wire and a distributed front end's door speak the vocabulary of `scheduling.tickets`.
PROXY = SCHEDULING.parent / "proxy"
COMPOSITION_ROOT = PROXY / "service.py"
FRONT_END_SIDE = [SCHEDULING / name for name in (
    "door/frontdoor.py", "door/remote.py", "door/wire.py", "door/questions.py", "tickets.py", "rows/columns.py",
)]
SPEAKERS = sorted(p for p in PROXY.rglob("*.py") if p != COMPOSITION_ROOT) + FRONT_END_SIDE


def imports_the_engine(source: str, package: str) -> bool:
    return any(name == "scheduling.runtime" or name.startswith("scheduling.runtime.")
               for name in imported_modules(source, package))


@pytest.mark.parametrize("module", SPEAKERS, ids=lambda p: str(p.relative_to(SCHEDULING.parent)))
def test_only_the_composition_root_imports_the_engine(module):
    package = ".".join(module.relative_to(SCHEDULING.parent).with_suffix("").parts[:-1])
    assert not imports_the_engine(module.read_text(), package)


@pytest.mark.parametrize("source", ["from scheduling.runtime import SchedulerRuntime", "import scheduling.runtime",
                                    "from ..runtime import Lease", "from scheduling.runtime.engine import SchedulerRuntime"])
def test_the_engine_scan_sees_each_way_in(source):
    assert imports_the_engine(source, "scheduling.sub")


def test_the_front_end_side_exists():
    assert all(path.exists() for path in [COMPOSITION_ROOT, *FRONT_END_SIDE])


# proxy/config reads and checks a file: it is used by the admin, replay and the worker alike, so it needs
# nothing of the HTTP side (the scheduling core's value types are its vocabulary).
CONFIG = PROXY / "config"
CONFIG_MODULES = sorted(CONFIG.rglob("*.py"))


def reaches_out_of_config(source: str, package: str) -> list[str]:
    return [name for name in imported_modules(source, package)
            if (name == "proxy" or name.startswith("proxy.")) and not name.startswith("proxy.config")]


@pytest.mark.parametrize("module", CONFIG_MODULES, ids=lambda p: str(p.relative_to(CONFIG)))
def test_the_config_reader_imports_nothing_else_of_proxy(module):
    package = ".".join(module.relative_to(SCHEDULING.parent).with_suffix("").parts[:-1])
    assert reaches_out_of_config(module.read_text(), package) == []


@pytest.mark.parametrize("source", ["from proxy.serving.errors import ProxyError", "from ..service import get_service",
                                    "import proxy.http.streaming"])
def test_the_config_scan_sees_a_reach_out(source):
    assert reaches_out_of_config(source, "proxy.config")


def test_the_config_scan_lets_its_own_and_the_core_be():
    assert reaches_out_of_config("from .loader import Config\nfrom scheduling.core import SwapGroup\n"
                                 "from proxy.config.errors import Problem", "proxy.config") == []


# -- no import circle ---------------------------------------------------------------------------------
FIRST_PARTY = ("scheduling", "proxy", "llamaswap_site")


def module_files(root: Path) -> dict[str, tuple[str, str]]:
    """Dotted name → (source, package its relative imports resolve against), for every first-party module."""
    found = {}
    for top in FIRST_PARTY:
        for path in (root / top).rglob("*.py"):
            if "migrations" in path.parts:
                continue
            parts = path.relative_to(root).with_suffix("").parts
            package = ".".join(parts[:-1])
            found[package if parts[-1] == "__init__" else ".".join(parts)] = (path.read_text(), package)
    return found


def import_graph(modules: dict[str, tuple[str, str]]) -> dict[str, set[str]]:
    """Which first-party modules each one imports, anywhere in it (a function's import closes a circle as
    surely as the top's); `from package import name` counts the submodule when `name` is one."""
    graph = {}
    for name, (source, package) in modules.items():
        targets = set()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Import):
                candidates = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = imported_modules(ast.unparse(node), package)[0]
                candidates = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                              for alias in node.names]
            else:
                continue
            for candidate in candidates:
                while candidate and candidate not in modules:  # a name inside a module: the module
                    candidate = candidate.rpartition(".")[0]
                if candidate and candidate != name:
                    targets.add(candidate)
        graph[name] = targets
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every group of modules that import each other round a circle (strongly connected, over one)."""
    order, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(module: str) -> None:
        order[module] = low[module] = len(order)
        stack.append(module)
        on_stack.add(module)
        for target in graph[module]:
            if target not in order:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in on_stack:
                low[module] = min(low[module], order[target])
        if low[module] == order[module]:
            group = []
            while not group or group[-1] != module:
                group.append(stack.pop())
                on_stack.discard(group[-1])
            if len(group) > 1:
                found.append(sorted(group))

    for module in graph:
        if module not in order:
            visit(module)
    return found


def test_no_module_imports_itself_round_a_circle():
    assert circles(import_graph(module_files(SCHEDULING.parent))) == []


def test_the_circle_scan_sees_a_circle_through_a_functions_import_and_a_package():
    modules = {
        "p": ("from . import a\n", "p"),
        "p.a": ("from .b import thing\n", "p"),
        "p.b": ("def f():\n    from p import a\n", "p"),
        "p.c": ("import p.a\n", "p"),
    }
    assert circles(import_graph(modules)) == [["p.a", "p.b"]]


def test_proxy_and_scheduling_never_import_the_site_package():
    """`llamaswap_site` (settings, urls, the ASGI application) composes `proxy` and `scheduling`: an import
    back up would be a circle in all but name (the serve command asks Channels for the application)."""
    modules = module_files(SCHEDULING.parent)
    upward = {name: sorted(t for t in targets if t.startswith("llamaswap_site"))
              for name, targets in import_graph(modules).items() if not name.startswith("llamaswap_site")}
    assert {name: targets for name, targets in upward.items() if targets} == {}


# -- the scheduler and the engine are composed, not mixed in -------------------------------------------------
# The scheduling core and the engine own their state in parts they build and name (`self.held`, `self.operators`,
# the scheduler's `WaitingRequests`): no class there takes a class of the project's own as a base, so what a part
# reads and changes is said where it is built, not spread over the methods of one object.
COMPOSED = ("scheduling/core", "scheduling/runtime")


def project_bases(sources: dict[str, str]) -> list[str]:
    """`module: Class(Base)` for each class in `sources` (name -> text) whose base is a class defined in any of them."""
    trees = {name: ast.parse(text) for name, text in sources.items()}
    defined = {node.name for tree in trees.values() for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}
    return sorted(f"{name}: {node.name}({ast.unparse(base)})" for name, tree in trees.items()
                  for node in ast.walk(tree) if isinstance(node, ast.ClassDef)
                  for base in node.bases if ast.unparse(base).split(".")[-1] in defined)


def test_the_core_and_the_engine_take_no_project_class_as_a_base():
    sources = {str(path.relative_to(SCHEDULING.parent)): path.read_text() for folder in COMPOSED
               for path in sorted((SCHEDULING.parent / folder).rglob("*.py"))}
    assert "scheduling/runtime/engine.py" in sources and "scheduling/core/serial.py" in sources
    assert project_bases(sources) == []


def test_the_base_scan_sees_a_mixin_by_name_and_through_a_module_and_passes_a_library_base():
    sources = {
        "engine.py": "from .operators import Operators\nclass Runtime(Operators, Exception):\n    pass\n",
        "operators.py": "class Operators:\n    pass\nclass Kept(enum.StrEnum):\n    pass\n",
        "other.py": "from . import operators\nclass Other(operators.Operators):\n    pass\n",
    }
    assert project_bases(sources) == ["engine.py: Runtime(Operators)", "other.py: Other(operators.Operators)"]


# -- folders say what their files are about ---------------------------------------------------------------
MAX_MODULES_AT_A_TOP_LEVEL = 20
MAX_MODULE_LINES = 560


@pytest.mark.parametrize("top", ["proxy", "scheduling"])
def test_each_top_level_holds_few_modules_and_the_rest_sit_in_folders_per_concept(top):
    modules = sorted(p.name for p in (SCHEDULING.parent / top).glob("*.py"))
    assert len(modules) <= MAX_MODULES_AT_A_TOP_LEVEL, modules


def product_modules() -> list[Path]:
    """Every module that serves: not the migrations (generated) nor the stand-in model server (`fakemodel/`)."""
    return [path for top in ("proxy", "scheduling", "llamaswap_site") for path in (SCHEDULING.parent / top).rglob("*.py")
            if "migrations" not in path.parts]


# Longer on purpose, each up to the lines given and for the reason given: one class whose parts change the same
# state within one call reads better whole than spread over files as mixins.
LONGER_ON_PURPOSE = {
    "scheduling/core/serial.py": (680, "the serial scheduler is one state machine: a reload, a memory measure or a "
                                       "lease change re-runs its dispatch on the same slots, starts and queue, and "
                                       "its state sits in owners (WaitingRequests, Slots, Starts) it names"),
}


def too_long(lengths: dict[str, int], allowed: dict[str, tuple[int, str]]) -> dict[str, int]:
    """The modules longer than the limit, or than the lines their exception allows."""
    return {name: lines for name, lines in lengths.items()
            if lines > (allowed[name][0] if name in allowed else MAX_MODULE_LINES)}


def module_lengths() -> dict[str, int]:
    return {str(path.relative_to(SCHEDULING.parent)): len(path.read_text().splitlines()) for path in product_modules()}


def test_no_product_module_is_longer_than_a_reader_can_hold():
    assert too_long(module_lengths(), LONGER_ON_PURPOSE) == {}


def test_each_length_exception_is_still_needed_and_says_why():
    lengths = module_lengths()
    assert {name: lengths.get(name) for name in LONGER_ON_PURPOSE
            if lengths.get(name, 0) <= MAX_MODULE_LINES} == {}
    assert all(len(why) > 40 for _, why in LONGER_ON_PURPOSE.values())


def test_the_length_scan_holds_an_exception_to_its_own_lines():
    allowed = {"long.py": (700, "one state machine read whole, for the test")}
    assert too_long({"long.py": 650, "other.py": 600, "short.py": 10}, allowed) == {"other.py": 600}
    assert too_long({"long.py": 701}, allowed) == {"long.py": 701}


def test_the_length_rule_scans_the_modules_it_means():
    scanned = {str(path.relative_to(SCHEDULING.parent)) for path in product_modules()}
    assert "scheduling/runtime/engine.py" in scanned and "proxy/http/consumers.py" in scanned
    assert "fakemodel/server.py" not in scanned and not any("migrations" in name for name in scanned)


# -- the rooms of proxy/ point one way ----------------------------------------------------------------------
# Each room of `proxy/` (a folder, or a module at its top) imports only rooms that stand below it here, never one
# above: the ways in at the top (the commands, the routing of the model paths, batches, the HTTP server), then the
# consumers of each protocol (a WebSocket's reuses the HTTP consumers' checks), the service's own views, the
# composition root, reaching the model servers, one model request whatever carries it (`serving`), the model
# processes, and the config reader at the ground. A new room must be given its place.
PROXY_ROOMS = (
    "management", "apps", "routing", "batches", "server", "websockets", "http", "api", "reload", "service",
    "upstream", "serving", "model_processes", "config", "version",
)


def room_of(module: str) -> str | None:
    """`proxy.serving.holding` → `serving`, `proxy.service` → `service`; None outside proxy, and for its face."""
    parts = module.split(".")
    return parts[1] if parts[0] == "proxy" and len(parts) > 1 else None


def imports_up_the_rooms(graph: dict[str, set[str]]) -> list[str]:
    """Every import inside proxy/ from one room to a room that stands above it in PROXY_ROOMS."""
    found = []
    for module, targets in graph.items():
        here = room_of(module)
        for target in targets:
            there = room_of(target)
            if here and there and there != here and PROXY_ROOMS.index(there) < PROXY_ROOMS.index(here):
                found.append(f"{module} -> {target}")
    return sorted(found)


def test_every_room_of_proxy_has_its_place():
    rooms = {room_of(name) for name in module_files(SCHEDULING.parent)} - {None}
    assert rooms == set(PROXY_ROOMS)


def test_imports_inside_proxy_point_down_the_rooms():
    assert imports_up_the_rooms(import_graph(module_files(SCHEDULING.parent))) == []


def test_the_room_scan_sees_an_import_up_through_a_package_a_function_and_a_relative_name():
    modules = {
        "proxy": ("", "proxy"),
        "proxy.service": ("from proxy.serving import holding\n", "proxy"),
        "proxy.serving": ("", "proxy.serving"),
        "proxy.serving.holding": ("from proxy import service\n", "proxy.serving"),
        "proxy.serving.inbound": ("def f():\n    from ..http.consumers import refused\n", "proxy.serving"),
        "proxy.http": ("", "proxy.http"),
        "proxy.http.consumers": ("from proxy.serving.holding import holding\nfrom . import streaming\n", "proxy.http"),
        "proxy.http.streaming": ("import proxy.serving.inbound\nimport scheduling.tickets\n", "proxy.http"),
    }
    assert imports_up_the_rooms(import_graph(modules)) == [
        "proxy.serving.holding -> proxy.service", "proxy.serving.inbound -> proxy.http.consumers"]


# -- scheduling/ in layers --------------------------------------------------------------------------------
# Inside `scheduling`, a module imports only from its own layer or the layers below it. From the ground up:
# the pure core; the words both sides share and the small tools every layer uses; the tables; the rows and the
# keys as rows; the door (the port, the wire, the questions); the engine; the operators' pages and metrics; the
# admin. A module takes the layer of the longest prefix that names it (a name ending in `$`: that module alone).
SCHEDULING_LAYERS = [
    ["scheduling.core"],
    ["scheduling.tickets", "scheduling.events", "scheduling.outage_log", "scheduling.whole_numbers",
     "scheduling.keys.quota", "scheduling.keys.scope", "scheduling.keys.secrets", "scheduling.keys$"],
    ["scheduling.models", "scheduling.apps", "scheduling$"],
    ["scheduling.rows", "scheduling.keys.store", "scheduling.keys.refusals"],
    ["scheduling.door"],
    ["scheduling.runtime"],
    ["scheduling.operating", "scheduling.metrics"],
    ["scheduling.admin", "scheduling.batch_metrics"],
]
# The two imports that run up on purpose: the door of a scheduler in this process is the engine's adapter, and
# a worker hands a request the engine handed over (`HandedOver`) to the worker taking over. Everything else in
# `door/` speaks the words of `tickets` (see `test_only_the_composition_root_imports_the_engine`).
UPWARD_ON_PURPOSE = {
    ("scheduling.door.in_process", "scheduling.runtime"),
    ("scheduling.door.worker", "scheduling.runtime"),
}


def names(prefix: str, module: str) -> bool:
    if prefix.endswith("$"):
        return module == prefix[:-1]
    return module == prefix or module.startswith(prefix + ".")


def layer_of(module: str, layers: list[list[str]]) -> int | None:
    """The layer of the longest prefix (a dotted name or a package above it) that names `module`."""
    best, found = -1, None
    for number, prefixes in enumerate(layers):
        for prefix in prefixes:
            if names(prefix, module) and len(prefix) > best:
                best, found = len(prefix), number
    return found


def against_the_layers(graph: dict[str, set[str]], layers: list[list[str]], top: str) -> set[tuple[str, str]]:
    """Each import, among the modules under `top`, of a module on a higher layer than the importer's."""
    inside = {name: targets for name, targets in graph.items() if name == top or name.startswith(top + ".")}
    return {(name, target) for name, targets in inside.items() for target in targets
            if (target == top or target.startswith(top + "."))
            and layer_of(target, layers) > layer_of(name, layers)}


def scheduling_graph() -> dict[str, set[str]]:
    return {name: targets for name, targets in import_graph(module_files(SCHEDULING.parent)).items()
            if name == "scheduling" or name.startswith("scheduling.")}


def test_every_scheduling_module_has_a_layer():
    assert [name for name in scheduling_graph() if layer_of(name, SCHEDULING_LAYERS) is None] == []


def test_each_layer_names_modules_that_exist():
    modules = set(scheduling_graph())
    assert [prefix for prefixes in SCHEDULING_LAYERS for prefix in prefixes
            if not any(names(prefix, module) for module in modules)] == []


def test_scheduling_imports_run_down_its_layers_but_the_two_on_purpose():
    assert against_the_layers(scheduling_graph(), SCHEDULING_LAYERS, "scheduling") == UPWARD_ON_PURPOSE


LAYERS_FOR_THE_SCAN = [["p.low"], ["p$", "p.mid", "p.mid.down"], ["p.high"]]


def test_the_layer_scan_takes_the_longest_prefix_and_an_exact_name_alone():
    assert [layer_of(name, [["p.mid.down"], ["p"], ["p.mid"]]) for name in ("p.mid.down.x", "p.mid.x", "p.other")] \
        == [0, 2, 1]
    assert [layer_of(name, [["p$"], ["p.mid"]]) for name in ("p", "p.mid.x", "p.other")] == [0, 1, None]


def test_the_layer_scan_sees_an_import_up_through_a_function_and_a_package():
    modules = {
        "p": ("", "p"),
        "p.low": ("def f():\n    from p.high import page\n", "p"),
        "p.mid": ("from . import high\n", "p"),
        "p.mid.down": ("from ..low import thing\n", "p.mid"),
        "p.high": ("from p.mid import down\nimport p.low\n", "p"),
    }
    assert against_the_layers(import_graph(modules), LAYERS_FOR_THE_SCAN, "p") == {("p.low", "p.high"),
                                                                                  ("p.mid", "p.high")}


def test_the_layer_scan_lets_down_and_sideways_imports_and_other_packages_be():
    modules = {
        "p": ("", "p"),
        "p.low": ("import q.top\n", "p"),
        "p.mid": ("from .low import thing\nfrom . import mid\n", "p"),
        "p.high": ("from p.mid import x\nfrom p import low\n", "p"),
        "q.top": ("import p.high\n", "q"),
    }
    assert against_the_layers(import_graph(modules), LAYERS_FOR_THE_SCAN, "p") == set()
