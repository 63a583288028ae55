"""The serial scheduler's settings in force: the config file's values, overridden from the admin.

An operator's override is stored (SchedulerSettings), audited (SettingsChange),
applied when the service starts or reloads its config (`stored_serial_settings`) and
pushed to the running scheduler as soon as the edit is committed, so the next pick uses it.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Collection, Mapping

from django.db import transaction
from django.utils import timezone

from scheduling.door import frontdoor
from scheduling.core import SerialSettings
from scheduling.core.fairness import fairness_problem
from scheduling.core.settings import serial_settings_problems, slot_count_problem
from scheduling.models import SchedulerSettings, SettingsChange
from scheduling.door.questions import Retune

log = logging.getLogger("llamaswap.settings")


def ignored_slots(slots: Mapping[str, object] | None, models: Collection[str] | None) -> dict[str, str]:
    """Entries of a stored `slots` override the scheduler leaves out, with why: a model the config
    does not have (it applies again once that model is configured), or a count the config file
    would refuse (an older admin took 2.0). Names are checked only when `models` is given. A stored value
    that is no table at all (written with SQL) is ignored whole."""
    if slots is not None and not isinstance(slots, Mapping):
        return {repr(slots): "not a table of model: count; the config's slots apply"}
    ignored = {}
    for model, count in (slots or {}).items():
        problem = slot_count_problem(model, count)
        if problem is not None:
            ignored[model] = problem
        elif models is not None and model not in models:
            ignored[model] = "not a configured model; it applies again once the config has it"
    return ignored


def ignored_slot_lines(slots: object, models: Collection[str] | None) -> list[str]:
    """`ignored_slots` as the settings page lists it: "model: count — why"."""
    if slots is not None and not isinstance(slots, Mapping):
        return [f"{as_text(slots)} — {why}" for why in ignored_slots(slots, models).values()]
    return [f"{model}: {slots[model]} — {why}" for model, why in ignored_slots(slots, models).items()]


def ignored_values(stored: SchedulerSettings) -> dict[str, str]:
    """agingDivisor, swapAffinityBonus and fairness overrides the scheduler leaves out, by model field, with why:
    a value the admin refuses, written into the table some other way (SQL, an older version)."""
    ignored = {}
    for field, others in (("aging_divisor", "swap_affinity_bonus"), ("swap_affinity_bonus", "aging_divisor")):
        value = getattr(stored, field)
        if value is None:
            continue
        values = {field: value, others: getattr(SerialSettings(), others)}
        name = SchedulerSettings.CONFIG_NAMES[field]
        problem = serial_settings_problems(values["aging_divisor"], values["swap_affinity_bonus"]).get(name)
        if problem is not None:
            ignored[field] = problem
    if stored.fairness is not None and (problem := fairness_problem(stored.fairness)) is not None:
        ignored["fairness"] = problem
    return ignored


_logged: set[str] = set()  # the ignored values this process has logged: each is logged once


def _log_once(text: str) -> None:
    if text not in _logged:
        _logged.add(text)
        log.warning("%s", text)


def stored_serial_settings(config: SerialSettings, models: Collection[str] | None = None) -> SerialSettings:
    """What the scheduler should use, given the config file's values and model IDs: the overrides win.

    A `slots` entry that cannot apply is left out with a warning, not allowed to stop the
    service or to block edits; it stays stored (and shown in the admin) until the operator
    drops it. Without `models` only the counts are checked.
    """
    stored = SchedulerSettings.objects.filter(pk=1).first()
    return config if stored is None else with_overrides(config, stored, models)


def with_overrides(config: SerialSettings, stored: SchedulerSettings, models: Collection[str] | None = None
                   ) -> SerialSettings:
    """`config` with the overrides of `stored` (saved or only proposed), as `stored_serial_settings` applies them."""
    overrides = stored.overrides()
    for field, why in ignored_values(stored).items():
        _log_once(f"ignoring the admin's {SchedulerSettings.CONFIG_NAMES[field]} override {overrides.pop(field)!r}, "
                  f"using the config's {getattr(config, field)!r}: {why}")
    if "slots" in overrides and not isinstance(overrides["slots"], Mapping):  # written some other way (SQL)
        _log_once(f"ignoring the admin's slots override {overrides.pop('slots')!r}, using the config's: it is not "
                  "a table of model: count")
    if "slots" in overrides:
        ignored = ignored_slots(overrides["slots"], models)
        for model, why in ignored.items():
            _log_once(f"ignoring the admin's slots override {model}: {overrides['slots'][model]}: {why}")
        overrides["slots"] = {m: n for m, n in overrides["slots"].items() if m not in ignored}
    return dataclasses.replace(config, **overrides)


def as_text(value: float | int | Mapping[str, int] | None) -> str | None:
    """A setting as an operator would type it (60, not 60.0; slots as "chat: 2, embed: 4");
    None stays None ("config file value")."""
    if value is None:
        return None
    if isinstance(value, Mapping):
        return ", ".join(f"{model}: {count}" for model, count in sorted(value.items())) or "every model 1"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return value if isinstance(value, str) else repr(value)


def save_settings(edited: SchedulerSettings, changed_by: str) -> list[SettingsChange]:
    """Store an operator's edit, audit every value it changes, and apply it to the running scheduler."""
    with transaction.atomic():
        before = SchedulerSettings.load()
        now = timezone.now()
        changes = [
            SettingsChange(
                changed_at=now,
                changed_by=changed_by,
                setting=name,
                old_value=as_text(getattr(before, field)),
                new_value=as_text(getattr(edited, field)),
            )
            for field, name in SchedulerSettings.CONFIG_NAMES.items()
            if getattr(before, field) != getattr(edited, field)
        ]
        edited.save()
        SettingsChange.objects.bulk_create(changes)
        if changes:
            transaction.on_commit(push_to_running_scheduler)
    return changes


def push_to_running_scheduler() -> bool:
    """Retune this process's scheduler with the stored settings; False when there is none to reach.

    The stored row is read again rather than passed in, so when two edits race the
    scheduler ends with whichever was committed last.
    """
    door = frontdoor.installed()
    if door is None:
        return False
    settings = stored_serial_settings(door.config.scheduler.serial, door.config.models)
    try:
        door.ask_now(Retune(settings))
    except frontdoor.Unanswered:
        log.exception("could not apply scheduler settings %s to the running scheduler", settings)
        return False
    log.info("scheduler settings now agingDivisor=%s swapAffinityBonus=%s slots=%s fairness=%s",
             settings.aging_divisor, settings.swap_affinity_bonus, as_text(settings.slots), settings.fairness)
    return True


def override_source(stored: SchedulerSettings, field: str) -> str:
    """Where a setting's value comes from, in words: the config file, or who overrode it and when."""
    if getattr(stored, field) is None:
        return "config file"
    change = SettingsChange.objects.filter(setting=SchedulerSettings.CONFIG_NAMES[field]).first()
    if change is None or change.new_value is None:
        return "admin override"
    at = timezone.localtime(change.changed_at).strftime("%Y-%m-%d %H:%M:%S %Z")
    return f"admin override by {change.changed_by} at {at}"
