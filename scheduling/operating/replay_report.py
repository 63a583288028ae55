"""A replay's comparison in words and numbers, shared by `llamaswap replay` and the settings page's
preview so both show the same rows under the same labels."""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping

from django.utils.safestring import SafeString

from scheduling.core import SerialSettings
from scheduling.core.replay import Change, Comparison, Fidelity, ReplayResult, Waits
from scheduling.operating.svg_charts import PALETTE, Chart, Series, render

_WHOLE = re.compile(r"[+-]?[0-9]+")  # ASCII digits only: int() would take "1_0" and "١٢"


def typed_number(text: str) -> int | float | str:
    """What an operator typed, as a number when it is one (60 as 60, not 60.0; a whole number exactly,
    however long, so a bound's message quotes it as typed), else as typed."""
    if _WHOLE.fullmatch(text) and len(text) <= sys.get_int_max_str_digits():
        return int(text)
    try:
        value = float(text)
    except ValueError:
        return text
    return int(value) if value.is_integer() else value


def shown(settings: SerialSettings) -> str:
    slots = ", ".join(f"{m}: {n}" for m, n in settings.slots.items()) or "1 each"
    return f"agingDivisor={typed_number(str(settings.aging_divisor))} swapAffinityBonus={settings.swap_affinity_bonus} " \
           f"slots={slots} fairness={settings.fairness}"


def hardware_text(hardware) -> str:
    """`hardware:` in a few words: each GPU's memory, or that placement by memory is off."""
    if hardware is None:
        return "not described (groups or matrix alone)"
    return ", ".join(f"GPU {gpu} {mib / 1024:g} GiB" for gpu, mib in hardware.gpus.items())


def seconds(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def waits_text(w: Waits) -> str:
    if not w.count:
        return "—"
    return f"{w.p50:.2f} / {w.p95:.2f} / {w.max:.2f} (n={w.count})"


def fidelity_text(measured: Fidelity) -> str:
    """How faithfully the settings in force reproduce the recording, in one sentence."""
    if measured.same_order is None:
        order = "no two requests waited together"
    else:
        order = f"{measured.same_order:.1%} of {measured.pairs:,} pairs that waited together sent in the same order"
    error = "no wait to compare" if measured.wait_error_s is None else f"median wait error {seconds(measured.wait_error_s)} s"
    return f"the settings in force against the recording, {measured.compared:,} requests sent in both: {order}; {error}"


def group_name(group: str) -> str:
    """A band, or an API key's name (`--by key`): "" is the requests with no row key."""
    return group or "(no row key)"


def comparison_rows(before: ReplayResult, after: ReplayResult, comparison: Comparison,
                    groups: Mapping[str, tuple[Waits, Waits]] | None = None) -> list[tuple[str, str, str]]:
    """(what, in force, proposed) rows: waits by band (or by the `groups` given), swaps, GPU busy share, reorders
    by term."""
    rows = [("settings", shown(before.settings), shown(after.settings))]
    for group, (ahead, behind) in (comparison.bands if groups is None else groups).items():
        rows.append((f"{group_name(group)} wait p50/p95/max s", waits_text(ahead), waits_text(behind)))
    return rows + [
        ("swaps (model loads)", str(before.swaps), str(after.swaps)),
        ("GPU-seconds loading models", f"{before.loading_gpu_s:.1f}", f"{after.loading_gpu_s:.1f}"),
        ("models stopped for memory", str(before.evicted_for_memory), str(after.evicted_for_memory)),
        ("GPU busy share", f"{before.busy_share:.1%}", f"{after.busy_share:.1%}"),
        ("picks aging changed", str(before.reorders_aging), str(after.reorders_aging)),
        ("picks affinity changed", str(before.reorders_affinity), str(after.reorders_affinity)),
        ("picks fair share changed", str(before.reorders_fairness), str(after.reorders_fairness)),
    ]


def change_text(c: Change) -> str:
    return f"#{c.id} {c.model} {c.band}: {c.before_s:.2f} s → {c.after_s:.2f} s ({c.after_s - c.before_s:+.2f} s)"


def handling_lines(before: ReplayResult, after: ReplayResult | None, peer_requests: int) -> list[str]:
    """What was left out of the replay, and what each run assumed where the recording could not tell.
    `peer_requests`: the window's requests relayed to peers, which never queue here."""
    h = before.handling
    lines = [f"Left out: {h.failed_starts} refused for a failed start, {h.refused_recorded} refused otherwise, "
             f"{h.unconfigured} of models no longer configured, {peer_requests} relayed to peers"]
    if after is not None and after.handling.unconfigured != h.unconfigured:
        lines.append(f"Proposed: {after.handling.unconfigured} of models its config does not have, left out")
    for name, r in [("In force", before)] + ([("Proposed", after)] if after is not None else []):
        lines.append(f"{name}: {_count(r.handling.left, 'client')} left while waiting, "
                     f"{r.handling.cancelled} cancelled by an operator, "
                     f"{_count(r.handling.timed_out, 'maximum wait')} ran out, {r.handling.refused} refused; "
                     f"{_count(r.handling.service_assumed, 'job length')} and {_count(r.handling.loads_assumed, 'load')} "
                     "not recorded, taken as the median")
    return lines


def _count(n: int, thing: str) -> str:
    return f"{n} {thing}" if n == 1 else f"{n} {thing}s"


def wait_chart(comparison: Comparison) -> SafeString:
    """p50 and p95 wait per band, in force beside proposed, as grouped bars (p95 paler)."""
    bands = list(comparison.bands)
    series = [
        Series(f"{run} {name}", [getattr(comparison.bands[band][side], name) for band in bands],
               dashed=name == "p95", colour=PALETTE[side])
        for name in ("p50", "p95") for side, run in enumerate(("in force", "proposed"))
    ]
    return render(Chart("Wait by band, in force and proposed", bands, bands, series, unit=" s", grouped_bars=True))
