"""The settings page's preview: what proposed values would have done to a recent window of traffic,
beside the settings in force — `llamaswap replay`'s comparison, for the page."""

from __future__ import annotations

from datetime import datetime

from scheduling.door import frontdoor

from scheduling.operating import overview
from scheduling.core.replay import compare
from scheduling.models import SchedulerSettings
from scheduling.operating.replay_history import what_if
from scheduling.operating.replay_report import change_text, comparison_rows, fidelity_text, handling_lines, wait_chart
from scheduling.operating.settings_store import with_overrides

WINDOWS = ("1h", "24h", "7d")
DEFAULT_WINDOW = "24h"


def chosen_window(text: str | None) -> str:
    """The window an operator picked; anything else (a stale or hand-made form) is the default."""
    return text if text in WINDOWS else DEFAULT_WINDOW


def preview(edited: SchedulerSettings, window: str, now: datetime) -> dict:
    """The preview panel's content: `edited` (unsaved) replayed over the `window` up to `now`."""
    try:
        config = frontdoor.current_config()
    except frontdoor.ConfigUnavailable as exc:
        return {"problem": f"cannot replay without the config in force: {exc}"}
    since = now - overview.PRESETS[window]
    proposed = with_overrides(config.scheduler.serial, edited, config.models)
    result = what_if(since, now, proposed, config)
    comparison = compare(result.before, result.after)
    return {
        "window": window,
        "since": since,
        "until": now,
        "requests": len(result.window.records),
        "settings_changes": result.window.settings_changes,
        "fidelity": fidelity_text(result.fidelity),
        "rows": comparison_rows(result.before, result.after, comparison),
        "changed_most": [change_text(c) for c in comparison.changed_most],
        "handling": handling_lines(result.before, result.after, result.window.peer_requests),
        "chart": wait_chart(comparison),
    }
