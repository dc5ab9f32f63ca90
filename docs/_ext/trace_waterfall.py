"""Draw exported spans as an SVG waterfall: the picture of docs/how-to/trace-a-job.md.

The spans come from the end-to-end tracing test, which writes them as JSON::

    JOBGUARD_TEST_TRACE_DUMP=/tmp/spans.json python -m pytest \\
        tests/processes/test_otel_processes.py -k view
    python docs/_ext/trace_waterfall.py /tmp/spans.json docs/images/trace-a-job.svg

One row per span, grouped by trace (the web request's first, then each attempt's, in time
order), indented under its parent; a dashed arrow for each link from an attempt to the span
it links to. Only the checkout job of the test is drawn (the job whose first attempt failed).
"""

from __future__ import annotations

import json
import sys
from html import escape
from typing import Any

ROW = 26
LABEL_WIDTH = 330
BAR_WIDTH = 560
TOP = 44
COLOURS = {"shop-web": "#3b82f6", "jobguard-worker": "#10b981"}
FAILED = "#ef4444"


def main(source: str, target: str) -> None:
    with open(source) as file:
        spans: list[dict[str, Any]] = json.load(file)
    sends = [s for s in spans if s["name"].startswith("send ")]
    charge_id = min(s["attributes"]["jobguard.job.id"] for s in sends)
    runs = {
        s["trace_id"]
        for s in spans
        if s["name"].startswith("process ") and s["attributes"].get("jobguard.job.id") == charge_id
    }
    web_trace = sends[0]["trace_id"]
    kept = [
        s
        for s in spans
        if s["trace_id"] in runs
        or (s["trace_id"] == web_trace and s["attributes"].get("jobguard.job.id") in (None, charge_id))
    ]
    rows = _ordered(kept)
    start = min(s["start_ns"] for s in kept)
    end = max(s["end_ns"] for s in kept)
    # Each trace on its own time scale: the seconds between them (a worker starting, a
    # retry's backoff) would shrink every span to a line. The header of each says when.
    bounds: dict[str, tuple[int, int]] = {}
    for span in kept:
        low, high = bounds.get(span["trace_id"], (span["start_ns"], span["end_ns"]))
        bounds[span["trace_id"]] = (min(low, span["start_ns"]), max(high, span["end_ns"]))

    def x_of(span: dict[str, Any], at: int) -> float:
        low, high = bounds[span["trace_id"]]
        return LABEL_WIDTH + (at - low) * BAR_WIDTH / max(1, high - low)

    layout: list[tuple[dict[str, Any] | None, int, int]] = []  # (span or a header, depth, y)
    y = TOP
    previous_trace = None
    for span, depth in rows:
        if span["trace_id"] != previous_trace:
            layout.append((None, 0, y))
            y += ROW
            previous_trace = span["trace_id"]
        layout.append((span, depth, y))
        y += ROW
    position = {entry[0]["span_id"]: entry[2] for entry in layout if entry[0] is not None}
    height = y + 40
    width_total = LABEL_WIDTH + BAR_WIDTH + 120
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width_total}" '
        f'height="{height}" font-family="sans-serif" font-size="12">',
        '<rect width="100%" height="100%" fill="white"/>',
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="6" '
        'markerHeight="6" orient="auto"><path d="M0,0 L10,5 L0,10 z" fill="#6b7280"/></marker></defs>',
        f'<text x="8" y="18" font-weight="bold">One checkout job, {(end - start) / 1e9:.2f} s from the '
        "request to its last attempt (blue: web process, green: worker process)</text>",
    ]
    for index, (span, depth, y) in enumerate(layout):
        if span is None:
            first = layout[index + 1][0]
            if first is None:  # a header is always followed by its trace's first span
                continue
            low, high = bounds[first["trace_id"]]
            title = (
                f"trace {first['trace_id'][:8]}… ({first['service']}), at +{(low - start) / 1e9:.3f} s, "
                f"{(high - low) / 1e6:.1f} ms wide"
            )
            out.append(f'<line x1="0" x2="{width_total}" y1="{y + 4}" y2="{y + 4}" stroke="#e5e7eb"/>')
            out.append(f'<text x="8" y="{y + 18}" fill="#6b7280">{escape(title)}</text>')
            continue
        attributes = span["attributes"]
        label = span["name"]
        if "jobguard.attempt" in attributes and span["name"].startswith("process "):
            label += f"  attempt {attributes['jobguard.attempt']}: {attributes.get('jobguard.outcome', '')}"
        x = x_of(span, span["start_ns"])
        width = max(2.0, x_of(span, span["end_ns"]) - x)
        failed = attributes.get("jobguard.outcome") in ("retry", "dead")
        colour = FAILED if failed else COLOURS.get(span["service"], "#6b7280")
        out.append(f'<text x="{8 + depth * 14}" y="{y + 14}">{escape(label)}</text>')
        out.append(
            f'<rect x="{x:.1f}" y="{y + 3}" width="{width:.1f}" height="{ROW - 10}" rx="2" fill="{colour}"/>'
        )
        millis = (span["end_ns"] - span["start_ns"]) / 1e6
        out.append(f'<text x="{x + width + 4:.1f}" y="{y + 14}" fill="#374151">{millis:.1f} ms</text>')
        for _, span_id, link in span["links"]:
            target_y = position.get(span_id)
            if target_y is None:
                continue
            linked = _by_id(kept, span_id)
            target_x = x_of(linked, linked["start_ns"])
            out.append(
                f'<path d="M{x:.1f},{y + ROW / 2} C{x - 60:.1f},{y + ROW / 2} {target_x - 60:.1f},'
                f'{target_y + ROW / 2} {target_x:.1f},{target_y + ROW / 2}" fill="none" stroke="#6b7280" '
                'stroke-dasharray="4 3" marker-end="url(#arrow)"><title>'
                f"{escape(link.get('jobguard.link', 'link'))}</title></path>"
            )
    out.append(
        f'<text x="8" y="{height - 14}" fill="#374151">Dashed arrows: span links (an attempt to the '
        "enqueue, and to the earlier attempts). Red: a failed attempt.</text>"
    )
    out.append("</svg>")
    with open(target, "w") as file:
        file.write("\n".join(out) + "\n")


def _by_id(spans: list[dict[str, Any]], span_id: str) -> dict[str, Any]:
    return next(s for s in spans if s["span_id"] == span_id)


def _ordered(spans: list[dict[str, Any]]) -> list[tuple[dict[str, Any], int]]:
    """Spans in trace order (by each trace's start), each parent followed by its children."""
    children: dict[str | None, list[dict[str, Any]]] = {}
    ids = {s["span_id"] for s in spans}
    for span in spans:
        parent = span["parent_id"] if span["parent_id"] in ids else None
        children.setdefault(parent, []).append(span)
    rows: list[tuple[dict[str, Any], int]] = []

    def walk(span: dict[str, Any], depth: int) -> None:
        rows.append((span, depth))
        for child in sorted(children.get(span["span_id"], []), key=lambda s: s["start_ns"]):
            walk(child, depth + 1)

    for root in sorted(children.get(None, []), key=lambda s: s["start_ns"]):
        walk(root, 0)
    return rows


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
