"""Small charts drawn as inline SVG on the server: no JavaScript and nothing fetched, so the admin works offline.

A chart is a row of buckets with one or more series over them, drawn as lines
or as stacked or grouped bars, with a y axis, bucket labels, a legend, and a tooltip
(an SVG <title>) on every point and bar.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

# Okabe–Ito: told apart also by colour-blind readers.
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#999999", "#F0E442")
WIDTH, HEIGHT = 760, 240
LEFT, RIGHT, TOP, BOTTOM = 56, 12, 10, 44  # the plot's margins; the legend sits under the bucket labels
MAX_LABELS = 8


@dataclass(frozen=True)
class Series:
    name: str
    values: Sequence[float | None]  # one per bucket; None leaves a gap
    dashed: bool = False
    colour: str = ""  # default: the palette, in series order


@dataclass(frozen=True)
class Chart:
    title: str
    labels: Sequence[str]  # each bucket's start, short, under the axis
    spans: Sequence[str]  # each bucket's span, in its tooltips
    series: Sequence[Series]
    unit: str = ""  # after each value: " s", "%", "/h"
    stacked_bars: bool = False
    grouped_bars: bool = False  # each bucket's series side by side, e.g. before and after


def render(chart: Chart) -> SafeString:
    """The chart as an <svg> element that scales to its container's width."""
    count = len(chart.labels)
    colours = [s.colour or PALETTE[i % len(PALETTE)] for i, s in enumerate(chart.series)]
    top = max(_stack_tops(chart) if chart.stacked_bars else
              [v for s in chart.series for v in s.values if v is not None], default=0)
    ticks = nice_ticks(top)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    slot = plot_w / max(count, 1)

    def y(value: float) -> float:
        return TOP + plot_h * (1 - value / ticks[-1])

    parts = [f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" width="100%" role="img" '
             f'aria-label="{escape(chart.title)}" xmlns="http://www.w3.org/2000/svg" '
             'font-size="11" font-family="sans-serif">',
             f"<title>{escape(chart.title)}</title>"]
    for tick, label in zip(ticks, tick_labels(ticks)):
        parts.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y(tick):.1f}" y2="{y(tick):.1f}" '
                     f'stroke="currentColor" stroke-opacity="{0.6 if tick == 0 else 0.15}"/>')
        parts.append(f'<text x="{LEFT - 6}" y="{y(tick) + 4:.1f}" text-anchor="end" fill="currentColor">'
                     f"{escape(label + chart.unit)}</text>")
    every = max(1, -(-count // MAX_LABELS))
    for b in range(0, count, every):
        x = LEFT + slot * (b + 0.5 if chart.grouped_bars else b)  # a group is named, a time bucket starts
        parts.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{TOP + plot_h}" y2="{TOP + plot_h + 4}" stroke="currentColor"/>')
        parts.append(f'<text x="{x:.1f}" y="{TOP + plot_h + 16}" text-anchor="middle" fill="currentColor">'
                     f"{escape(chart.labels[b])}</text>")
    if not chart.series:
        parts.append(f'<text x="{LEFT + plot_w / 2:.0f}" y="{TOP + plot_h / 2:.0f}" text-anchor="middle" '
                     'fill="currentColor">none in this window</text>')
    if chart.stacked_bars:
        parts += _bars(chart, colours, slot, y)
    elif chart.grouped_bars:
        parts += _grouped(chart, colours, slot, y)
    else:
        parts += _lines(chart, colours, slot, y)
    parts += _legend(chart, colours)
    parts.append("</svg>")
    return mark_safe("".join(parts))


def _stack_tops(chart: Chart) -> list[float]:
    return [sum(s.values[b] or 0 for s in chart.series) for b in range(len(chart.labels))]


def _tip(chart: Chart, b: int, series: Series) -> str:
    return escape(f"{chart.spans[b]} · {series.name}: {readable(series.values[b])}{chart.unit}")


def _bars(chart: Chart, colours: list[str], slot: float, y) -> list[str]:
    parts, width = [], max(slot * 0.8, 1)
    for b in range(len(chart.labels)):
        base = 0.0
        x = LEFT + slot * b + (slot - width) / 2
        for series, colour in zip(chart.series, colours):
            value = series.values[b] or 0
            if value <= 0:
                continue
            parts.append(f'<rect x="{x:.1f}" y="{y(base + value):.1f}" width="{width:.1f}" '
                         f'height="{y(base) - y(base + value):.1f}" fill="{colour}">'
                         f"<title>{_tip(chart, b, series)}</title></rect>")
            base += value
    return parts


def _grouped(chart: Chart, colours: list[str], slot: float, y) -> list[str]:
    parts, width = [], max(slot * 0.8 / max(len(chart.series), 1), 1)
    for b in range(len(chart.labels)):
        x = LEFT + slot * b + slot * 0.1
        for series, colour in zip(chart.series, colours):
            value = series.values[b]
            faded = ' fill-opacity="0.55"' if series.dashed else ""  # a dashed series' bars are paler
            if value is not None and value > 0:
                parts.append(f'<rect x="{x:.1f}" y="{y(value):.1f}" width="{width:.1f}" '
                             f'height="{y(0) - y(value):.1f}" fill="{colour}"{faded}>'
                             f"<title>{_tip(chart, b, series)}</title></rect>")
            x += width
    return parts


def _lines(chart: Chart, colours: list[str], slot: float, y) -> list[str]:
    parts = []
    for series, colour in zip(chart.series, colours):
        dash = ' stroke-dasharray="5 3"' if series.dashed else ""
        run: list[str] = []
        points = []
        for b, value in enumerate([*series.values, None]):  # the None ends the last run
            if value is None:
                if len(run) > 1:
                    parts.append(f'<polyline points="{" ".join(run)}" fill="none" stroke="{colour}" '
                                 f'stroke-width="2"{dash}/>')
                run = []
                continue
            x, point_y = LEFT + slot * (b + 0.5), y(value)
            run.append(f"{x:.1f},{point_y:.1f}")
            points.append(f'<circle cx="{x:.1f}" cy="{point_y:.1f}" r="3" fill="{colour}">'
                          f"<title>{_tip(chart, b, series)}</title></circle>")
        parts += points
    return parts


def _legend(chart: Chart, colours: list[str]) -> list[str]:
    parts, x, y = [], LEFT, HEIGHT - 8
    for series, colour in zip(chart.series, colours):
        dash = ' stroke-dasharray="5 3"' if series.dashed else ""
        parts.append(f'<line x1="{x}" x2="{x + 16}" y1="{y - 4}" y2="{y - 4}" stroke="{colour}" stroke-width="'
                     f'{8 if chart.stacked_bars or chart.grouped_bars else 3}"{dash}/>')
        parts.append(f'<text x="{x + 20}" y="{y}" fill="currentColor">{escape(series.name)}</text>')
        x += 30 + 7 * len(series.name)
    return parts


def nice_ticks(top: float) -> list[float]:
    """0 and round steps (1, 2 or 5 times a power of ten) up to at least `top`: four or five gridlines."""
    if top <= 0:
        return [0.0, 1.0]
    power = 10 ** math.floor(math.log10(top / 4))
    step = next(m * power for m in (1, 2, 5, 10) if m * power * 4 >= top)
    ticks = [0.0]
    while ticks[-1] < top:
        ticks.append(round(ticks[-1] + step, 12))
    return ticks


def tick_labels(ticks: list[float]) -> list[str]:
    """The axis's labels, with as many decimals as the step between ticks needs (0.005 apart: 0.005, 0.01, 0.015),
    so no two read alike, as `readable`'s rounding to two decimals made 0.01 and 0.015 both "0.01"."""
    step = ticks[1] - ticks[0]
    decimals = max(0, -math.floor(math.log10(step) + 1e-9))
    labels = []
    for tick in ticks:
        text = f"{tick:,.{decimals}f}"
        labels.append(text.rstrip("0").rstrip(".") if "." in text else text)
    return labels


def readable(value: float | None) -> str:
    """A value as people read it: 1,234 / 56.7 / 0.25 / 0.003."""
    if value is None:
        return "—"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        text = f"{value:.1f}"
    elif abs(value) >= 0.01 or value == 0:
        text = f"{value:.2f}"
    else:
        return f"{value:.1g}"
    return text.rstrip("0").rstrip(".") if "." in text else text
