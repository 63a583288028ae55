"""`llamaswap replay [--since ISO] [--until ISO] [--set KEY=N ...] [--sweep KEY=N,N,...] [--try-config FILE]
[--json]`: what other scheduler settings, or another config file (its hardware, models' memory, groups or
matrix), would have done to the recorded traffic of a window, beside the config and settings in force, and
how faithfully a replay reproduces the recording."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections.abc import Iterable
from datetime import datetime, timedelta

from django.conf import settings
from django.core.management.base import BaseCommand
from django.db import DatabaseError
from django.utils import timezone

from scheduling.core import SerialSettings, serial_settings_problems
from scheduling.core.replay import Recorded, ReplayResult, compare, waits, waits_by_band, waits_by_key
from scheduling.operating.replay_report import (
    change_text, comparison_rows, fidelity_text, group_name, handling_lines, hardware_text, shown, typed_number,
    waits_text,
)

KEYS = "agingDivisor=N, swapAffinityBonus=N, slots.MODEL=N or fairness=keys|off"


class SettingError(ValueError):
    """A --set or --sweep the operator must fix; the message names the key and the fix."""


def with_setting(base: SerialSettings, option: str, assignment: str, models) -> SerialSettings:
    """`base` with one `KEY=VALUE` applied."""
    key, sep, text = assignment.partition("=")
    key = key.strip()
    if not sep or not key:
        raise SettingError(f"{option} {assignment!r}: expected KEY=VALUE with KEY one of {KEYS}")
    value = typed_number(text.strip())
    aging, bonus, slots, fairness = base.aging_divisor, base.swap_affinity_bonus, dict(base.slots), base.fairness
    if key == "agingDivisor":
        aging = value
    elif key == "swapAffinityBonus":
        bonus = value
    elif key == "fairness":
        fairness = value
    elif key.startswith("slots.") and key[len("slots."):]:
        model = key[len("slots."):]
        if model not in models:
            raise SettingError(f"{option} {assignment}: {model!r} is not a configured model — "
                               f"use one of {', '.join(sorted(models))}")
        slots[model] = value
    else:
        raise SettingError(f"{option} {assignment}: no setting {key!r} — use {KEYS}")
    problems = serial_settings_problems(aging, bonus, slots, fairness)
    if problems:
        raise SettingError(f"{option} {assignment}: {next(iter(problems.values()))}")
    return SerialSettings(aging_divisor=aging, swap_affinity_bonus=bonus, slots=slots, fairness=fairness)


def run_json(result: ReplayResult, records: Iterable[Recorded] = ()) -> dict:
    """A run's figures; with the window's `records`, its waits by API key too ("" for no row key)."""
    return {
        "settings": {"agingDivisor": result.settings.aging_divisor,
                     "swapAffinityBonus": result.settings.swap_affinity_bonus, "slots": dict(result.settings.slots),
                     "fairness": result.settings.fairness},
        "waits": {band: dataclasses.asdict(w) for band, w in waits_by_band(result).items()},
        "waits_by_key": {key: dataclasses.asdict(w) for key, w in waits_by_key(result, records).items()},
        "swaps": result.swaps,
        "loading_gpu_s": result.loading_gpu_s,
        "evicted_for_memory": result.evicted_for_memory,
        "busy_share": result.busy_share,
        "reorders": {"aging": result.reorders_aging, "affinity": result.reorders_affinity,
                     "fair_share": result.reorders_fairness},
        "handling": dataclasses.asdict(result.handling),
    }


class Command(BaseCommand):
    help = "Replay the recorded requests of a window with other scheduler settings, beside the settings in force."

    def add_arguments(self, parser):
        parser.add_argument("--since", help="start of the window, ISO 8601, UTC unless it has an offset "
                            "(default: 24 hours before --until)")
        parser.add_argument("--until", help="end of the window, ISO 8601 (default: now)")
        parser.add_argument("--set", action="append", default=[], metavar="KEY=N", help=f"a proposed value: {KEYS}")
        parser.add_argument("--sweep", metavar="KEY=N,N,...",
                            help="one replay per value, e.g. agingDivisor=15,30,60,120 (with any --set)")
        parser.add_argument("--try-config", metavar="FILE",
                            help="replay the proposal with this config file instead (its hardware, models' memory, "
                            "groups or matrix, and settings), beside the one in force")
        parser.add_argument("--by", choices=("band", "key"), default="band",
                            help="show the waits by band (default) or by the API key the requests came with")
        parser.add_argument("--json", action="store_true", help="print JSON for scripts (waits by band and by key)")
        parser.add_argument("--config", help="llama-swap config.yaml (default: LLAMASWAP_CONFIG)")

    def handle(self, *args, **options):
        from proxy.management.config_file import read_config
        from scheduling.operating.replay_history import replays, settings_in_force

        path = options["config"] or settings.LLAMASWAP_CONFIG
        if not path:
            self._fail("no config file: pass --config FILE (the one `llamaswap serve` runs with)")
        config = read_config(self, path, summary=False)
        tried = self._tried(options["try_config"])
        until = self._moment("--until", options["until"]) or timezone.now()
        since = self._moment("--since", options["since"]) or until - timedelta(hours=24)
        if since >= until:
            self._fail(f"--since {since.isoformat()} is not before --until {until.isoformat()}")
        try:
            in_force = settings_in_force(config)
        except DatabaseError as exc:
            self._fail(f"cannot read the request history ({exc}): run this where `llamaswap serve` keeps its data "
                       "(LLAMASWAP_DATA_DIR or DATABASE_URL)")
        proposing = config if tried is None else tried
        try:
            proposed = in_force if tried is None else settings_in_force(tried)
            for assignment in options["set"]:
                proposed = with_setting(proposed, "--set", assignment, proposing.models)
            sweep = self._sweep(options["sweep"], proposed, proposing.models)
        except SettingError as exc:
            self._fail(str(exc))
        # (path, config) of the run in force and of the proposal's
        self.configs = ((path, config), (options["try_config"] or path, proposing))
        self.by_key = options["by"] == "key"
        if sweep is None:
            played = replays(since, until, [proposed], config, tried)
            self._print_comparison(played.window, played.fidelity, played.before, played.after[0], options["json"])
        else:
            key, values = sweep
            played = replays(since, until, [s for _, s in values], config, tried)
            runs = [(value, result) for (value, _), result in zip(values, played.after, strict=True)]
            self._print_sweep(played.window, played.fidelity, played.before, key, runs, options["json"])

    def _tried(self, path: str | None):
        """The config `--try-config` names, loaded and checked; exit 2 naming the file when it does not load."""
        from proxy.config import ConfigError, load_config

        if path is None:
            return None
        if not os.path.exists(path):
            self._fail(f"--try-config {path}: no such file — give the path of the config file to try")
        if os.path.isdir(path):
            self._fail(f"--try-config {path}: a directory, not a file — give the path of the config file to try")
        try:
            return load_config(os.path.abspath(path))
        except ConfigError as exc:
            self._fail(f"--try-config {path}: the file does not load as a config:\n{exc}")
        except OSError as exc:
            self._fail(f"--try-config {path}: cannot read the file: {exc.strerror}")

    def _fail(self, message: str) -> None:
        self.stderr.write(message)
        sys.exit(2)

    def _moment(self, option: str, text: str | None) -> datetime | None:
        if text is None:
            return None
        try:
            moment = datetime.fromisoformat(text)
        except ValueError:
            self._fail(f"{option} {text!r}: not an ISO 8601 time — e.g. 2026-12-03T09:00 or 2026-12-03T09:00+01:00")
        return moment if timezone.is_aware(moment) else timezone.make_aware(moment)

    def _sweep(self, text: str | None, base: SerialSettings, models):
        """(key, [(value, settings)]) for `--sweep KEY=V1,V2,...`, or None."""
        if text is None:
            return None
        key, sep, values = text.partition("=")
        if not sep or not values.strip():
            raise SettingError(f"--sweep {text!r}: expected KEY=N,N,... e.g. agingDivisor=15,30,60,120")
        return key.strip(), [(v.strip(), with_setting(base, "--sweep", f"{key.strip()}={v.strip()}", models))
                             for v in values.split(",")]

    # -- output -------------------------------------------------------------------------------

    def _header(self, window, measured) -> list[str]:
        handled = len(window.records)
        lines = [f"Replay of {handled:,} requests that arrived from {window.since.isoformat(timespec='seconds')} "
                 f"to {window.until.isoformat(timespec='seconds')}"]
        lines.append(f"Fidelity ({fidelity_text(measured)})")
        if not window.records:
            lines.append("No requests arrived in this window: widen it with --since and --until")
        if window.settings_changes:
            lines.append(f"note: the settings were edited {window.settings_changes} times within the window; "
                         "the replay uses those in force now throughout")
        return lines

    def _print_comparison(self, window, measured, before, after, as_json: bool) -> None:
        comparison = compare(before, after)
        if as_json:
            self.stdout.write(json.dumps({
                "window": self._window_json(window),
                "fidelity": dataclasses.asdict(measured),
                "in_force": {"config": self.configs[0][0], **run_json(before, window.records)},
                "proposed": {"config": self.configs[1][0], **run_json(after, window.records)},
                "changed_most": [dataclasses.asdict(c) for c in comparison.changed_most],
            }, indent=2))
            return
        groups = None
        if self.by_key:
            ahead, behind = waits_by_key(before, window.records), waits_by_key(after, window.records)
            empty = waits(())
            groups = {key: (ahead.get(key, empty), behind.get(key, empty)) for key in sorted({*ahead, *behind})}
        rows = comparison_rows(before, after, comparison, groups)
        (path, config), (tried_path, tried) = self.configs
        if tried is not config:
            rows[1:1] = [("config", path, tried_path), ("hardware", hardware_text(config.hardware),
                                                         hardware_text(tried.hardware))]
        width = max(len(r[0]) for r in rows)
        middle = max(len(r[1]) for r in rows)
        lines = self._header(window, measured) + [""]
        lines.append(f"{'':<{width}}  {'in force':<{middle}}  proposed")
        lines += [f"{name:<{width}}  {a:<{middle}}  {b}" for name, a, b in rows]
        lines += ["", *handling_lines(before, after, window.peer_requests)]
        if comparison.changed_most:
            lines += ["", "Requests whose wait changed most:"]
            lines += [f"  {change_text(c)}" for c in comparison.changed_most]
        self.stdout.write("\n".join(lines))

    def _print_sweep(self, window, measured, before, key, runs, as_json: bool) -> None:
        if as_json:
            self.stdout.write(json.dumps({
                "window": self._window_json(window),
                "fidelity": dataclasses.asdict(measured),
                "in_force": {"config": self.configs[0][0], **run_json(before, window.records)},
                "sweep": {"key": key, "config": self.configs[1][0], "runs": [{"value": typed_number(value), **run_json(r, window.records)} for value, r in runs]},
            }, indent=2))
            return
        lines = self._header(window, measured) + ["", f"In force: {shown(before.settings)}"]
        (_, config), (tried_path, tried) = self.configs
        if tried is not config:
            lines.append(f"Swept with {tried_path} (hardware: {hardware_text(tried.hardware)})")
        lines.append("")
        def grouped(result):
            return waits_by_key(result, window.records) if self.by_key else waits_by_band(result)

        groups = sorted({group for _, result in [("in force", before), *runs] for group in grouped(result)},
                        key=list(waits_by_band(before)).index if not self.by_key else None)
        head = [key, *(f"{group_name(group)} p50/p95/max s" for group in groups), "swaps", "GPU-s loading", "GPU busy",
                "aging / affinity changed"]
        table = [head]
        for value, result in [("in force", before), *runs]:
            by_group = grouped(result)
            table.append([value, *(waits_text(by_group.get(group, waits(()))) for group in groups), str(result.swaps),
                          f"{result.loading_gpu_s:.1f}", f"{result.busy_share:.1%}", f"{result.reorders_aging} / {result.reorders_affinity}"])
        widths = [max(len(row[i]) for row in table) for i in range(len(head))]
        lines += ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in table]
        lines += ["", *handling_lines(before, None, window.peer_requests)]
        self.stdout.write("\n".join(lines))

    @staticmethod
    def _window_json(window) -> dict:
        return {"since": window.since.isoformat(), "until": window.until.isoformat(), "requests": len(window.records),
                "warm": window.warm, "settings_changes": window.settings_changes, "peer_requests": window.peer_requests}
