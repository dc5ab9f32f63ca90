"""The admin's SVG charts: one bar per sample, gaps for missing samples, every label escaped."""

import datetime

from django_jobguard.admin.charts import bar_chart

MINUTES = [datetime.datetime(2026, 12, 1, 9, m, tzinfo=datetime.UTC) for m in range(3)]


def test_a_chart_draws_one_bar_per_sample_and_leaves_gaps():
    svg = str(bar_chart("Failed <b>", MINUTES, [1.0, None, 4.0], unit="attempts"))
    assert svg.count("<rect") == 2
    assert "<title>Failed &lt;b&gt;</title>" in svg and "<b>" not in svg
    assert "<title>09:02 UTC: 4 attempts</title>" in svg
    assert 'text-anchor="end" class="tick">4<' in svg  # the peak labels the axis


def test_an_empty_chart_still_renders_an_axis():
    svg = str(bar_chart("Nothing", MINUTES, [None, None, None]))
    assert "<rect" not in svg and 'class="axis"' in svg
