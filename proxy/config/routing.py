"""`groups` / `routing.router` (which models may run together) and `routing.scheduler`
(which waiting request is served next)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from scheduling.core.settings import MAX_SLOTS, SerialSettings, serial_settings_problems, slots_example
from scheduling.core.matrix import MatrixPolicy
from scheduling.core.swap import DEFAULT_GROUP, SwapGroup

from .fields import MISSING, Section
from .matrix import read_matrix
from .model_index import ModelIndex

ROUTERS = ("group", "matrix")
SCHEDULERS = ("fifo", "serial")
DEFAULT_SCHEDULER = "fifo"
# A model's fifo priority: far beyond the header's bands (100 apart), far within what a sum with any
# header can be held to (signed 64 bits).
MAX_FIFO_PRIORITY = 10**9


@dataclass(frozen=True)
class SchedulerConfig:
    use: str = DEFAULT_SCHEDULER
    serial: SerialSettings = field(default_factory=SerialSettings)
    fifo_priority: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True)
class RouterConfig:
    """Which models may run together: llama-swap's group router, or its matrix router."""

    groups: tuple[SwapGroup, ...] = ()
    matrix: MatrixPolicy | None = None


def read_router(top: Section, routing: Section | None, index: ModelIndex) -> RouterConfig:
    """`routing.router` (`use`, `settings.groups`, `settings.matrix`) or the legacy top-level
    `groups` / `matrix`; the two spellings cannot be mixed."""
    router = routing.section("router") if routing else None
    settings = router.section("settings") if router else None
    use = router.text("use", "") if router else ""
    legacy = [name for name in ("groups", "matrix") if _given(top.raw(name))]

    if use not in ("", *ROUTERS):
        router.error("use", f'unknown router "{use}" — valid routers are: {", ".join(ROUTERS)}')
        use = ""
    if legacy and router is not None:
        for name in legacy:
            top.error(
                name,
                f"the legacy top-level {name} and the routing.router block are both set — "
                f"move the {name} to routing.router.settings.{name} and delete the top-level key",
            )
        return RouterConfig()
    if len(legacy) == 2:
        top.error("matrix", "the top-level groups and matrix are both set — a config uses one router: delete one")
        return RouterConfig()
    if legacy:
        use = "group" if legacy == ["groups"] else "matrix"
        block = top.section(legacy[0])
    else:
        use = use or "group"
        name = "groups" if use == "group" else "matrix"
        block = settings.section(name) if settings else None
        if settings is not None:
            other = "matrix" if use == "group" else "groups"
            settings.warn_unread(notes={other: f"ignored because routing.router.use is {use}"})
        if router is not None:
            router.warn_unread()
        if use == "matrix" and block is None and (settings is None or settings.data.get("matrix") is None):
            top.log.error(
                f"{router.path('settings')}.matrix",
                "missing — routing.router.use is matrix: add settings.matrix with its sets "
                '(e.g. sets: {chat_and_tts: "(llm-a | llm-b) & tts"}) or use: group',
            )
    if use == "matrix":
        return RouterConfig(matrix=read_matrix(block, index) if block is not None else None)
    return RouterConfig(groups=_read_group_map(block, index))


def _given(value: object) -> bool:
    return value is not MISSING and value is not None


def _read_group_map(groups: Section | None, index: ModelIndex) -> tuple[SwapGroup, ...]:
    if groups is None:
        return ()
    result = []
    member_of: dict[str, str] = {}
    for raw_name in list(groups.data):
        name = str(raw_name)
        if name == DEFAULT_GROUP:
            groups.raw(raw_name)
            groups.error(name, f"{DEFAULT_GROUP} is the name of the implicit group of ungrouped models — rename this group")
            continue
        group = groups.section(raw_name)
        if group is None:
            continue
        members = []
        for position, member in enumerate(group.text_list("members", example="model-a, model-b")):
            key = f"{group.path('members')}[{position}]"
            real = index.resolve(member)
            if real is None:
                group.log.error(key, index.unknown(member))
            elif real in members:
                group.log.error(key, f'"{member}" is listed twice in this group — remove one')
            elif real in member_of:
                group.log.error(
                    key,
                    f'model {real} is already in group {member_of[real]} — a model can belong to only one group',
                )
            else:
                members.append(real)
                member_of[real] = name
        if not group.has("members"):
            group.error("members", "missing — list the model IDs of this group, e.g. members: [model-a, model-b]")
        result.append(
            SwapGroup(
                name=name,
                members=tuple(members),
                swap=group.boolean("swap", True),
                exclusive=group.boolean("exclusive", True),
                persistent=group.boolean("persistent", False),
            )
        )
        group.warn_unread()
    return tuple(result)


def read_scheduler(routing: Section | None, index: ModelIndex, placing: bool = False) -> SchedulerConfig:
    """`routing.scheduler`. With `hardware:` described (`placing`) the default is the serial scheduler, which
    places models by memory; fifo, llama-swap's one-start-at-a-time order, cannot."""
    default = "serial" if placing else DEFAULT_SCHEDULER
    scheduler = routing.section("scheduler") if routing else None
    if scheduler is None:
        return SchedulerConfig(use=default)
    use = scheduler.text("use", default)
    if use not in SCHEDULERS:
        scheduler.error("use", f'unknown scheduler "{use}" — valid schedulers are: {", ".join(SCHEDULERS)}')
        use = default
    if placing and use == "fifo":
        scheduler.error("use", "the fifo scheduler cannot place models by memory (hardware: is given) — "
                               "use serial (the default with hardware), or remove hardware:")
        use = default
    settings = scheduler.section("settings")
    serial_section = settings.section("serial") if settings else None
    fifo_section = settings.section("fifo") if settings else None
    serial = _read_serial(serial_section, index)
    priority = _read_fifo_priority(fifo_section, index)
    if settings is not None:
        settings.warn_unread()
    in_use = f"routing.scheduler.use is {use}" + ("" if scheduler.has("use") else " (the default)")
    _warn_unused(serial_section, ("agingDivisor", "swapAffinityBonus", "slots", "fairness"), "serial", use, in_use)
    _warn_unused(fifo_section, ("priority",), "fifo", use, in_use)
    scheduler.warn_unread()
    return SchedulerConfig(use=use, serial=serial, fifo_priority=MappingProxyType(priority))


def _warn_unused(section: Section | None, names: tuple[str, ...], owner: str, use: str, in_use: str) -> None:
    """Settings of the scheduler not in use are checked but do nothing; say so rather than let them look applied."""
    if section is None or use == owner:
        return
    for name in names:
        if section.has(name):
            section.log.warn(
                section.path(name),
                f"ignored because {in_use} — {owner} settings apply only to the {owner} scheduler (use: {owner})",
            )


def _read_serial(serial: Section | None, index: ModelIndex) -> SerialSettings:
    defaults = SerialSettings()
    if serial is None:
        return defaults
    slots = _read_slots(serial, index)
    aging = serial.expanded("agingDivisor")
    bonus = serial.expanded("swapAffinityBonus")
    aging = aging if _given(aging) else defaults.aging_divisor
    bonus = bonus if _given(bonus) else defaults.swap_affinity_bonus
    fairness = serial.expanded("fairness")
    # YAML reads a bare off as false; anything else not a mode is the setting's error to report.
    fairness = "off" if fairness is False else fairness if _given(fairness) else defaults.fairness
    problems = serial_settings_problems(aging, bonus, fairness=fairness)
    for name, message in problems.items():
        serial.error(name, message)
    serial.warn_unread()
    if problems:
        return defaults
    return SerialSettings(aging_divisor=float(aging), swap_affinity_bonus=int(bonus), slots=slots, fairness=fairness)


def _read_slots(serial: Section, index: ModelIndex) -> dict[str, int]:
    """`slots: {<model id or alias>: N}`: how many requests each model's server takes at once."""
    table = serial.section("slots")
    if table is None:
        return {}
    return table.model_integers(
        index.resolve, index.unknown, "slots are", default=None, minimum=1, maximum=MAX_SLOTS,
        example=slots_example,
    )


def _read_fifo_priority(fifo: Section | None, index: ModelIndex) -> dict[str, int]:
    if fifo is None:
        return {}
    table = fifo.section("priority")
    fifo.warn_unread()
    if table is None:
        return {}
    return table.model_integers(index.resolve, index.unknown, "priority is", default=0, minimum=-MAX_FIFO_PRIORITY,
                                maximum=MAX_FIFO_PRIORITY, example=lambda name: f"{name}: 10")

