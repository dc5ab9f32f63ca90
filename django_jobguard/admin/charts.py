"""Small server-side SVG charts for the admin: readable without JavaScript, no CDN, no library."""

from __future__ import annotations

import datetime
import math
from collections.abc import Sequence

from django.utils import timezone
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

#: Size of one chart, in SVG user units (it scales with the page width).
WIDTH = 360
HEIGHT = 110
#: Room for the axis labels.
LEFT = 34
BOTTOM = 16
TOP = 6


#: Round axis maxima: the first of these times a power of ten at or above the largest value.
NICE_STEPS = (1.0, 2.0, 2.5, 5.0, 10.0)


def _label(value: float, unit: str) -> str:
    """At most three significant digits, so a label fits the axis and a tooltip reads at a glance."""
    if unit == "seconds" and value >= 60:
        return f"{value / 60:.0f}m" if value < 3600 else f"{value / 3600:.1f}h"
    if value >= 1000:
        return f"{value / 1000:.3g}k"
    return f"{value:.3g}"


def nice_ceiling(value: float) -> float:
    """The axis maximum for a largest value: 1, 2, 2.5 or 5 times a power of ten, at or above it."""
    if value <= 0:
        return 1.0
    magnitude = 10.0 ** math.floor(math.log10(value))
    for step in NICE_STEPS:
        if step * magnitude >= value * (1 - 1e-9):
            return step * magnitude
    return 10 * magnitude


def bar_chart(
    title: str,
    minutes: Sequence[datetime.datetime],
    values: Sequence[float | None],
    *,
    unit: str = "",
    css_class: str = "",
) -> SafeString:
    """One bar per minute (a missing sample draws nothing), a round max label, and time ticks.

    Every number and label is escaped; each bar carries a ``<title>`` tooltip
    ("09:41 UTC: 12 jobs") that screen readers also read.
    """
    known = [value for value in values if value is not None]
    # A round maximum labels the axis: "5" rather than a clipped "4.00735".
    peak = nice_ceiling(max(known, default=0.0))
    plot_w = WIDTH - LEFT
    plot_h = HEIGHT - BOTTOM - TOP
    step = plot_w / max(1, len(values))
    parts = [
        f'<svg class="jobguard-chart {escape(css_class)}" viewBox="0 0 {WIDTH} {HEIGHT}" '
        f'role="img" aria-label="{escape(title)}" xmlns="http://www.w3.org/2000/svg">',
        f"<title>{escape(title)}</title>",
        f'<line x1="{LEFT}" y1="{TOP + plot_h}" x2="{WIDTH}" y2="{TOP + plot_h}" class="axis"/>',
        f'<text x="{LEFT - 3}" y="{TOP + 8}" text-anchor="end" class="tick">'
        f"{escape(_label(peak, unit))}</text>",
        f'<text x="{LEFT - 3}" y="{TOP + plot_h}" text-anchor="end" class="tick">0</text>',
    ]
    for i, (minute, value) in enumerate(zip(minutes, values, strict=True)):
        if value is None:
            continue
        height = plot_h * value / peak
        x = LEFT + i * step
        tip = f"{timezone.localtime(minute):%H:%M %Z}: {_label(value, unit)} {unit}".rstrip()
        parts.append(
            f'<rect x="{x:.1f}" y="{TOP + plot_h - height:.1f}" width="{max(step - 1, 1):.1f}" '
            f'height="{height:.1f}" class="bar"><title>{escape(tip)}</title></rect>'
        )
    ticks = ((0, "start"), (len(minutes) // 2, "middle"), (len(minutes) - 1, "end")) if minutes else ()
    for i, anchor in ticks:
        # The outer labels lean inwards, so neither is cut off at the edge of the chart.
        x = LEFT + i * step + (0 if anchor == "start" else step if anchor == "end" else step / 2)
        label = f"{timezone.localtime(minutes[i]):%H:%M}"
        parts.append(
            f'<text x="{x:.1f}" y="{HEIGHT - 3}" text-anchor="{anchor}" class="tick">{escape(label)}</text>'
        )
    parts.append("</svg>")
    return mark_safe("".join(parts))  # noqa: S308 - built from escaped text and numbers only
